//! `RunOnceLayer` (worker crate docs: a job runs once per job id). On the in-memory store under
//! paused time: the lease is renewed while a slow handler runs, a failure releases the claim, a
//! success makes later deliveries duplicates, and the delivery's deadline reaches a handler called
//! after the claim. Through a real worker on a `redis-server`: one effect per job id on the memory
//! and the Redis store, and a duplicate entry enqueued during a long run is acknowledged as a
//! duplicate.

mod support;

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::{
    config, dead_letters, eventually, handler, manager, ok, pending, start, xadd, Log, CLAIM_IDLE,
};
use tower::{Layer, ServiceExt};
use tower_once_idempotency::store::redis::RedisStore;
use tower_once_idempotency::store::MemoryStore;
use tower_once_test_support::redis::RedisServer;
use tower_once_timeout::Deadline;
use tower_once_worker::{Job, JobError, JobId, Producer, RunOnceLayer, Worker};

fn job(id: &str) -> Job {
    Job::new("1-0", JobId::new(id).unwrap(), "{}", 1)
}

#[tokio::test(start_paused = true)]
async fn a_slow_handler_keeps_its_claim_and_later_deliveries_are_duplicates() {
    let calls = Arc::new(AtomicU32::new(0));
    let counter = calls.clone();
    let layer = RunOnceLayer::new(MemoryStore::new()).lease(Duration::from_millis(300));
    let svc = layer.layer(tower::service_fn(move |_job: Job| {
        counter.fetch_add(1, SeqCst);
        async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            Ok::<_, JobError>("sent")
        }
    }));
    let first = tokio::spawn(svc.clone().oneshot(job("mail-1")));
    // Three leases later the first delivery is still running: the renewals kept the claim.
    tokio::time::sleep(Duration::from_millis(900)).await;
    let second = svc.clone().oneshot(job("mail-1")).await.unwrap_err();
    assert!(second.is_in_progress(), "{second}");
    assert_eq!(first.await.unwrap().unwrap().into_response(), Some("sent"));
    assert!(svc
        .clone()
        .oneshot(job("mail-1"))
        .await
        .unwrap()
        .is_duplicate());
    assert_eq!(calls.load(SeqCst), 1, "one effect for three deliveries");
}

#[tokio::test(start_paused = true)]
async fn a_failure_releases_the_claim_so_the_next_delivery_runs() {
    let calls = Arc::new(AtomicU32::new(0));
    let counter = calls.clone();
    let svc = RunOnceLayer::new(MemoryStore::new()).layer(tower::service_fn(move |_job: Job| {
        let n = counter.fetch_add(1, SeqCst);
        async move {
            if n == 0 {
                Err(JobError::transient("smtp down"))
            } else {
                Ok(())
            }
        }
    }));
    let err = svc.clone().oneshot(job("mail-2")).await.unwrap_err();
    assert!(err.is_inner() && err.get_inner().unwrap().is_transient());
    assert!(!svc
        .clone()
        .oneshot(job("mail-2"))
        .await
        .unwrap()
        .is_duplicate());
    assert!(svc
        .clone()
        .oneshot(job("mail-2"))
        .await
        .unwrap()
        .is_duplicate());
    assert_eq!(calls.load(SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn the_delivery_deadline_reaches_a_handler_called_after_the_claim() {
    let deadline = Deadline::after(Duration::from_secs(5));
    let svc = RunOnceLayer::new(MemoryStore::new()).layer(tower::service_fn(|_job: Job| {
        let seen = Deadline::current();
        async move { Ok::<_, JobError>(seen) }
    }));
    let outcome = svc
        .oneshot(job("mail-3").with_deadline(deadline))
        .await
        .unwrap();
    assert_eq!(outcome.into_response(), Some(Some(deadline)));
}

/// A job carries its delivery's deadline and a retry attempt's mark (it is a `Carrier`): a
/// handler stack behind a `Buffer`, called from another task, ends at the deadline, and an inner
/// retry layer defers to the outer one instead of multiplying attempts.
#[tokio::test(start_paused = true)]
async fn a_jobs_deadline_and_attempt_mark_cross_a_buffer_and_a_task() {
    use tower_once_retry::RetryLayer;
    use tower_once_timeout::TimeoutLayer;

    // The deadline: a hanging handler behind a Buffer, on another task, ends at it.
    let calls = Arc::new(AtomicU32::new(0));
    let counter = calls.clone();
    let hanging = tower::service_fn(move |_job: Job| {
        counter.fetch_add(1, SeqCst);
        std::future::pending::<Result<(), JobError>>()
    });
    let stack = RetryLayer::new()
        .no_budget()
        .layer(TimeoutLayer::new(Duration::from_secs(30)).layer(hanging));
    let buffered = tower::buffer::Buffer::new(stack, 4);
    let started = tokio::time::Instant::now();
    let delivery = job("deadline-1").with_deadline(Deadline::after(Duration::from_secs(2)));
    let outcome = tokio::spawn(buffered.oneshot(delivery)).await.unwrap();
    assert!(outcome.is_err());
    assert_eq!(calls.load(SeqCst), 1, "no retry after the deadline");
    assert_eq!(started.elapsed(), Duration::from_secs(2));

    // The mark: an inner retry on another task makes one attempt per outer attempt.
    let calls = Arc::new(AtomicU32::new(0));
    let counter = calls.clone();
    let failing = tower::service_fn(move |_job: Job| {
        counter.fetch_add(1, SeqCst);
        async { Err::<(), _>(JobError::transient("busy")) }
    });
    let inner = RetryLayer::new().no_budget().layer(failing);
    let spawning = tower::service_fn(move |job: Job| {
        let inner = inner.clone();
        async move { tokio::spawn(inner.oneshot(job)).await.unwrap() }
    });
    let outer = RetryLayer::new()
        .no_budget()
        .max_attempts(3)
        .layer(spawning);
    let err = outer.oneshot(job("nested-1")).await.unwrap_err();
    assert_eq!(err.attempts(), 3);
    assert_eq!(calls.load(SeqCst), 3, "3 attempts, not 3 x 4");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_once_gives_one_effect_per_job_id_on_memory_and_redis_stores() {
    let server = RedisServer::start();
    let mut conn = manager(&server.url()).await;
    let redis_store = RedisStore::connect(&server.url()).await.unwrap();
    for (stream, memory) in [("mem", true), ("red", false)] {
        let log = Log::default();
        let outcomes = Arc::new(Mutex::new(Vec::new()));
        let inner = handler(&log, ok);
        let seen = outcomes.clone();
        let run_once = |svc| -> tower::util::BoxCloneService<Job, (), tower_once_worker::BoxError> {
            let seen = seen.clone();
            let record = move |o: tower_once_worker::RunOnceOutcome<()>| {
                seen.lock().unwrap().push(o.is_duplicate())
            };
            if memory {
                tower::util::BoxCloneService::new(
                    RunOnceLayer::new(MemoryStore::new())
                        .layer(svc)
                        .map_response(record)
                        .map_err(Into::into),
                )
            } else {
                tower::util::BoxCloneService::new(
                    RunOnceLayer::new(redis_store.clone())
                        .layer(svc)
                        .map_response(record)
                        .map_err(Into::into),
                )
            }
        };
        let svc = run_once(inner);
        let producer = Producer::new(conn.clone(), stream);
        let job = JobId::from_scoped_key(&tower_once_idempotency::store::StoreKey::from_bytes(
            [4; 32],
        ));
        producer.enqueue(&job, "{}").await.unwrap();
        producer.enqueue(&job, "{}").await.unwrap();
        let worker =
            start!(
                Worker::connect(&server.url(), config(stream, "w").concurrency(1), svc).unwrap()
            );
        eventually("both acked", || async {
            outcomes.lock().unwrap().len() == 2
        })
        .await;
        let report = worker.stop().await;
        assert_eq!(log.calls(job.as_str()), 1, "{stream}: one effect");
        assert_eq!(
            *outcomes.lock().unwrap(),
            [false, true],
            "{stream}: done, then duplicate"
        );
        assert_eq!(report.acked, 2);
        assert_eq!(pending(&mut conn, stream).await, 0);
    }
}

/// The same job id enqueued twice while the first run takes longer than `claim_idle *
/// max_deliveries`: the second entry is acknowledged as a duplicate (the run-once claim names its
/// stream entry), never dead-lettered for a job whose effect succeeded. Was broken: each delivery
/// of the duplicate found the claim in progress, was classified transient and left pending, burnt a
/// delivery, and the duplicate was finally dead-lettered (`max_deliveries`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_enqueued_during_a_long_run_is_acked_as_duplicate() {
    let server = RedisServer::start();
    let mut conn = manager(&server.url()).await;
    let log = Log::default();
    let effects = Arc::new(AtomicUsize::new(0));
    let done = effects.clone();
    let inner = handler(&log, |_| Ok(Duration::from_secs(3))).map_response(move |()| {
        done.fetch_add(1, Ordering::SeqCst);
    });
    let svc = RunOnceLayer::new(MemoryStore::new())
        .lease(CLAIM_IDLE / 2)
        .layer(inner);
    xadd(&mut conn, "dup", "order-1", "{}").await;
    xadd(&mut conn, "dup", "order-1", "{}").await;
    let worker = start!(Worker::connect(
        &server.url(),
        config("dup", "w").concurrency(4).max_deliveries(2),
        svc
    )
    .unwrap());
    eventually("the effect", || async {
        effects.load(Ordering::SeqCst) == 1
    })
    .await;
    eventually("nothing pending", || {
        let mut conn = conn.clone();
        async move { pending(&mut conn, "dup").await == 0 }
    })
    .await;
    let report = worker.stop().await;
    assert_eq!(log.calls("order-1"), 1, "one run (holds)");
    let dead = dead_letters(&mut conn, "dup").await;
    assert!(
        dead.is_empty(),
        "the duplicate of a job that succeeded was dead-lettered: {dead:?}; report {report:?}"
    );
}
