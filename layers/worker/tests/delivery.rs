//! Deliveries (worker crate docs, worker crate docs "Semantics"), against real
//! `redis-server` processes: a success is acknowledged once, a permanent error is dead-lettered
//! after one call, a transient one stays pending and is redelivered with its delivery count until
//! `max_deliveries` dead-letters it unrun, a `RetryLayer` inside absorbs failures within one
//! delivery, and no more entries are read than there are free slots. Each test counts handler calls
//! and effects; Redis idle times are real time, so `claim_idle` is short and every wait is a
//! bounded poll.

mod support;

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::{
    config, dead_letters, eventually, handler, manager, pending, start, xadd, Log, Tap, CLAIM_IDLE,
    LIMIT,
};
use tokio::time::Instant;
use tower::{Layer, ServiceExt};
use tower_once_retry::backoff::Backoff;
use tower_once_retry::classify::HttpClassifier;
use tower_once_retry::RetryLayer;
use tower_once_test_support::redis::RedisServer;
use tower_once_worker::dead_letter::DeadLetters;
use tower_once_worker::{Job, JobError, JobId, Producer, Worker};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_successes_and_dead_letters_a_permanent_failure_after_one_call() {
    let server = RedisServer::start();
    let mut conn = manager(&server.url()).await;
    let log = Log::default();
    let svc = handler(&log, |job| match job.job_id().as_str() {
        "bad" => Err(JobError::permanent("card declined")),
        _ => Ok(Duration::ZERO),
    });
    let producer = Producer::new(conn.clone(), "jobs");
    for i in 0..20 {
        producer
            .enqueue(&JobId::new(format!("ok-{i}")).unwrap(), "{}")
            .await
            .unwrap();
    }
    let bad_id = producer
        .enqueue(&JobId::new("bad").unwrap(), "p")
        .await
        .unwrap();
    let worker = start!(Worker::connect(&server.url(), config("jobs", "w1"), svc).unwrap());
    let dead = DeadLetters::new(conn.clone(), "jobs");
    eventually("one dead letter", || async {
        dead.count().await.unwrap() == 1
    })
    .await;
    eventually("all acked", || {
        let mut c = conn.clone();
        async move { pending(&mut c, "jobs").await == 0 }
    })
    .await;
    // Give a wrongful redelivery time to happen (several claim_idle periods).
    tokio::time::sleep(CLAIM_IDLE * 4).await;
    let report = worker.stop().await;

    for i in 0..20 {
        assert_eq!(log.deliveries(&format!("ok-{i}")), [1]);
    }
    assert_eq!(log.calls("bad"), 1, "a permanent error is not retried");
    assert_eq!((report.acked, report.dead_lettered), (20, 1));
    let letters = dead.list("-", 10).await.unwrap();
    let letter = &letters[0];
    assert_eq!(
        (
            letter.job_id.as_str(),
            letter.reason.as_str(),
            letter.deliveries
        ),
        ("bad", "permanent", 1)
    );
    assert_eq!(letter.stream_id, bad_id);
    assert_eq!(letter.payload, b"p");
    assert!(letter.error.contains("card declined"), "{}", letter.error);
    assert_eq!(pending(&mut conn, "jobs").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_runs_max_deliveries_times_and_the_next_delivery_dead_letters_it() {
    let server = RedisServer::start();
    let mut conn = manager(&server.url()).await;
    let log = Log::default();
    let svc = handler(&log, |_| Err(JobError::transient("upstream down")));
    let id = xadd(&mut conn, "jobs", "poison", "{}").await;
    let worker =
        start!(
            Worker::connect(&server.url(), config("jobs", "w1").max_deliveries(3), svc).unwrap()
        );
    let dead = DeadLetters::new(conn.clone(), "jobs");
    eventually("the dead letter", || async {
        dead.count().await.unwrap() == 1
    })
    .await;
    let report = worker.stop().await;

    assert_eq!(
        log.deliveries("poison"),
        [1, 2, 3],
        "exactly max_deliveries calls"
    );
    let letter = &dead.list("-", 10).await.unwrap()[0];
    assert_eq!(
        (letter.reason.as_str(), letter.deliveries),
        ("max_deliveries", 4)
    );
    assert_eq!(letter.stream_id, id);
    assert_eq!(
        letter.error, "",
        "the handler was not called for delivery 4"
    );
    assert_eq!((report.left_pending, report.dead_lettered), (3, 1));
    assert_eq!(pending(&mut conn, "jobs").await, 0);
}

/// Known limit (worker crate docs, "Known limits"; ignored): an always-failing transient handler
/// with `max_deliveries = 3` should run exactly 3 times, and the 4th claim dead-letter it. When the
/// reply to the `XREADGROUP` that handed out the entry is lost (Redis executed it; the client timed
/// out), the entry sits in this consumer's pending list with delivery count 1 and the handler never
/// saw it; the takeover counts 2. The handler then runs only twice before the entry is dead-
/// lettered with `deliveries` 4. (With `max_deliveries = 1` the job is dead-lettered without ever
/// running.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "known limit (worker docs): a delivery whose XREADGROUP reply was lost still counts toward max_deliveries"]
async fn a_lost_xreadgroup_reply_costs_a_delivery_the_handler_never_saw() {
    let server = RedisServer::start();
    let mut conn = manager(&server.url()).await;
    let log = Log::default();
    let svc = handler(&log, |_| Err(JobError::transient("always fails")));
    let mut reader = Tap::new(manager(&server.url()).await);
    reader.lose_reply_of = "XREADGROUP";
    reader.lose.store(true, Ordering::SeqCst);
    let writer = Tap::new(manager(&server.url()).await);
    let cfg = config("lost", "w")
        .max_deliveries(3)
        .command_timeout(Duration::from_millis(500));
    xadd(&mut conn, "lost", "poison-1", "{}").await;
    let worker = start!(Worker::new(cfg, reader, writer, svc).unwrap());
    eventually("dead-lettered", || {
        let mut conn = conn.clone();
        async move { !dead_letters(&mut conn, "lost").await.is_empty() }
    })
    .await;
    worker.stop().await;
    let dead = dead_letters(&mut conn, "lost").await;
    assert_eq!(
        log.calls("poison-1"),
        3,
        "max_deliveries = 3 must mean 3 runs; dead letter: {dead:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_layer_inside_makes_four_attempts_then_the_entry_stays_pending() {
    let server = RedisServer::start();
    let mut conn = manager(&server.url()).await;
    let attempts = Arc::new(Mutex::new(0u32));
    let counter = attempts.clone();
    let upstream = RetryLayer::new()
        .classify(HttpClassifier)
        .max_attempts(4)
        .backoff(Backoff::new(Duration::from_millis(1), 2.0, Duration::from_millis(5)).unwrap())
        .no_budget()
        .layer(tower::service_fn(move |_job_id: String| {
            *counter.lock().unwrap() += 1;
            async {
                let busy = http::Response::builder().status(429).body(()).unwrap();
                Ok::<_, std::io::Error>(busy)
            }
        }));
    let svc = tower::service_fn(move |job: Job| {
        let upstream = upstream.clone();
        async move {
            let response = upstream
                .oneshot(job.job_id().to_string())
                .await
                .map_err(JobError::transient)?;
            if response.status().is_success() {
                Ok(())
            } else {
                Err(JobError::transient(format!(
                    "upstream answered {}",
                    response.status()
                )))
            }
        }
    });
    xadd(&mut conn, "jobs", "rate-limited", "{}").await;
    // A long claim_idle: this test is about one delivery.
    let config = config("jobs", "w1").claim_idle(Duration::from_secs(60));
    let worker = start!(Worker::connect(&server.url(), config, svc).unwrap());
    eventually("four attempts", || async { *attempts.lock().unwrap() == 4 }).await;
    let report = worker.stop().await;

    assert_eq!(*attempts.lock().unwrap(), 4);
    assert_eq!(report.left_pending, 1);
    assert_eq!(
        pending(&mut conn, "jobs").await,
        1,
        "left pending for redelivery"
    );
    assert_eq!(
        DeadLetters::new(conn.clone(), "jobs")
            .count()
            .await
            .unwrap(),
        0,
        "not dead-lettered"
    );
}

/// Backpressure: never more handlers running than `concurrency`, and never more entries read
/// than there are slots (the rest wait in the stream, not in the worker's memory).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_bounds_running_handlers_and_entries_read() {
    let server = RedisServer::start();
    let mut conn = manager(&server.url()).await;
    let running = Arc::new(Mutex::new((0usize, 0usize))); // (now, max)
    let gauge = running.clone();
    let log = Log::default();
    let counter = log.clone();
    let svc = tower::service_fn(move |job: Job| {
        let gauge = gauge.clone();
        counter.record(&job);
        async move {
            {
                let mut g = gauge.lock().unwrap();
                g.0 += 1;
                g.1 = g.1.max(g.0);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            gauge.lock().unwrap().0 -= 1;
            Ok::<_, JobError>(())
        }
    });
    for i in 0..12 {
        xadd(&mut conn, "jobs", &format!("b{i}"), "{}").await;
    }
    let worker =
        start!(Worker::connect(&server.url(), config("jobs", "w").concurrency(3), svc).unwrap());
    let mut most_pending = 0;
    let started = Instant::now();
    while !(0..12).all(|i| log.calls(&format!("b{i}")) == 1) {
        assert!(started.elapsed() < LIMIT, "timed out");
        most_pending = most_pending.max(pending(&mut conn, "jobs").await);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    worker.stop().await;
    assert_eq!(
        running.lock().unwrap().1,
        3,
        "at most (and here exactly) 3 at once"
    );
    // Read but unfinished, plus finished ones whose batched XACK is on its way.
    assert!(most_pending <= 6, "{most_pending} entries pending at once");
    assert_eq!(pending(&mut conn, "jobs").await, 0);
}
