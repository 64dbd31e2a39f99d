//! The worker library against real `redis-server` processes (and a three-master Redis
//! Cluster): takeover after `claim_idle`, poison and permanent jobs, a `RetryLayer` inside,
//! run-once, graceful shutdown, a Redis restart, dead-letter admin and safe trimming. Each
//! test counts handler calls and effects, not only statuses. Redis idle times are real time,
//! so `claim_idle` is short and every wait is a bounded poll.
#![cfg(feature = "worker")]

mod support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::worker::{eventually, first_pending, manager, pending, start, xadd, LIMIT};
use tokio::time::Instant;
use tower::{Layer, ServiceExt};
use tower_once::idempotency::store::redis::RedisStore;
use tower_once::idempotency::store::MemoryStore;
use tower_once::retry::backoff::Backoff;
use tower_once::retry::classify::HttpClassifier;
use tower_once::retry::RetryLayer;
use tower_once::worker::dead_letter::DeadLetters;
use tower_once::worker::redis::{self, Value};
use tower_once::worker::{Job, JobError, JobId, Producer, RunOnceLayer, Worker, WorkerConfig};
use tower_once_test_support::ports::free_port;
use tower_once_test_support::redis::{RedisCluster, RedisServer};

const CLAIM_IDLE: Duration = Duration::from_millis(300);

/// Calls per job id, and the deliveries each call saw.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<HashMap<String, Vec<u64>>>>);

impl Log {
    fn record(&self, job: &Job) {
        let mut map = self.0.lock().unwrap();
        map.entry(job.job_id().to_string())
            .or_default()
            .push(job.deliveries());
    }
    fn calls(&self, id: &str) -> usize {
        self.0.lock().unwrap().get(id).map_or(0, Vec::len)
    }
    fn deliveries(&self, id: &str) -> Vec<u64> {
        self.0.lock().unwrap().get(id).cloned().unwrap_or_default()
    }
}

fn config(stream: &str, consumer: &str) -> WorkerConfig {
    WorkerConfig::new(stream, "workers")
        .consumer(consumer)
        .claim_idle(CLAIM_IDLE)
        .shutdown_grace(Duration::from_secs(10))
}

/// A handler that logs each call and behaves as `behave(job)` says.
fn handler(
    log: &Log,
    behave: impl Fn(&Job) -> Result<Duration, JobError> + Clone + Send + Sync + 'static,
) -> impl tower::Service<Job, Response = (), Error = JobError, Future = impl Send> + Clone + Send + 'static
{
    let log = log.clone();
    tower::service_fn(move |job: Job| {
        log.record(&job);
        let outcome = behave(&job);
        async move {
            tokio::time::sleep(outcome?).await;
            Ok(())
        }
    })
}

fn ok(_: &Job) -> Result<Duration, JobError> {
    Ok(Duration::ZERO)
}

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_dead_right_after_xreadgroup_loses_its_entry_only_after_claim_idle() {
    let server = RedisServer::start();
    let mut conn = manager(&server.url()).await;
    redis::cmd("XGROUP")
        .arg("CREATE")
        .arg("jobs")
        .arg("workers")
        .arg("0")
        .arg("MKSTREAM")
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
    xadd(&mut conn, "jobs", "orphan", "{}").await;
    // The "ghost" consumer reads the entry and dies before doing anything with it.
    let read: Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg("workers")
        .arg("ghost")
        .arg("COUNT")
        .arg(1)
        .arg("STREAMS")
        .arg("jobs")
        .arg(">")
        .query_async(&mut conn)
        .await
        .unwrap();
    let read_at = Instant::now();
    assert!(matches!(read, Value::Array(ref s) if !s.is_empty()));

    let log = Log::default();
    let called_at = Arc::new(Mutex::new(None));
    let at = called_at.clone();
    let svc = handler(&log, move |_| {
        at.lock().unwrap().get_or_insert(Instant::now());
        Ok(Duration::ZERO)
    });
    let worker = start!(Worker::connect(&server.url(), config("jobs", "w1"), svc).unwrap());
    eventually("the takeover", || async { log.calls("orphan") == 1 }).await;
    let report = worker.stop().await;

    let waited = called_at.lock().unwrap().unwrap() - read_at;
    assert!(
        waited >= CLAIM_IDLE,
        "taken over after {waited:?}, before claim_idle"
    );
    assert_eq!(log.deliveries("orphan"), [2]);
    assert_eq!(report.acked, 1);
    assert_eq!(pending(&mut conn, "jobs").await, 0);
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_job_stays_with_its_live_worker_and_leaves_a_dead_one() {
    let server = RedisServer::start();
    let mut conn = manager(&server.url()).await;
    let log = Log::default();
    let svc = handler(&log, |_| Ok(CLAIM_IDLE * 3));
    let a = start!(Worker::connect(&server.url(), config("jobs", "a"), svc.clone()).unwrap());
    xadd(&mut conn, "jobs", "slow", "{}").await;
    eventually("started on a", || async { log.calls("slow") == 1 }).await;
    let b = start!(Worker::connect(&server.url(), config("jobs", "b"), svc.clone()).unwrap());
    eventually("acked", || {
        let mut c = conn.clone();
        async move { pending(&mut c, "jobs").await == 0 }
    })
    .await;
    assert_eq!(log.deliveries("slow"), [1], "b never took it over");
    let (ra, rb) = (a.stop().await, b.stop().await);
    assert_eq!((ra.acked, rb.acked), (1, 0));

    // Now the worker running it dies (its task is dropped: no ack, no refresh).
    let dying =
        start!(Worker::connect(&server.url(), config("jobs", "dying"), svc.clone()).unwrap());
    xadd(&mut conn, "jobs", "orphan", "{}").await;
    eventually("started on the dying worker", || async {
        log.calls("orphan") == 1
    })
    .await;
    dying.abort();
    let heir = start!(Worker::connect(&server.url(), config("jobs", "heir"), svc).unwrap());
    eventually("taken over and acked", || {
        let mut c = conn.clone();
        let log = log.clone();
        async move { log.calls("orphan") == 2 && pending(&mut c, "jobs").await == 0 }
    })
    .await;
    assert_eq!(log.deliveries("orphan"), [1, 2]);
    assert_eq!(heir.stop().await.acked, 1);
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
        let run_once =
            |svc| -> tower::util::BoxCloneService<Job, (), tower_once::worker::BoxError> {
                let seen = seen.clone();
                let record = move |o: tower_once::worker::RunOnceOutcome<()>| {
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
        let job = JobId::from_scoped_key(&tower_once::idempotency::store::StoreKey::from_bytes(
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_mid_batch_loses_nothing_and_acks_nothing_unprocessed() {
    let server = RedisServer::start();
    let mut conn = manager(&server.url()).await;
    let log = Log::default();
    let svc = handler(&log, |_| Ok(Duration::from_millis(200)));
    let ids: Vec<String> = (0..12).map(|i| format!("j{i}")).collect();
    for id in &ids {
        xadd(&mut conn, "jobs", id, "{}").await;
    }
    let first = start!(Worker::connect(
        &server.url(),
        config("jobs", "first").concurrency(4),
        svc.clone()
    )
    .unwrap());
    eventually("a batch in flight", || async {
        log.0.lock().unwrap().len() >= 2
    })
    .await;
    let report = first.stop().await;
    let started_first: Vec<String> = log.0.lock().unwrap().keys().cloned().collect();
    assert_eq!(
        report.acked as usize,
        started_first.len(),
        "every started job finished and was acked"
    );
    assert_eq!(report.abandoned, 0);
    assert_eq!(
        pending(&mut conn, "jobs").await,
        0,
        "nothing read and left behind"
    );

    let second = start!(Worker::connect(&server.url(), config("jobs", "second"), svc).unwrap());
    eventually("the rest", || async {
        ids.iter().all(|id| log.calls(id) >= 1)
    })
    .await;
    second.stop().await;
    for id in &ids {
        assert_eq!(log.calls(id), 1, "{id} ran once");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_recovers_from_a_redis_restart_on_its_own() {
    let mut server = RedisServer::start();
    let log = Log::default();
    let svc = handler(&log, ok);
    let worker = start!(Worker::connect(&server.url(), config("jobs", "w1"), svc).unwrap());
    {
        let mut conn = manager(&server.url()).await;
        for i in 0..5 {
            xadd(&mut conn, "jobs", &format!("before-{i}"), "{}").await;
        }
        eventually("before the restart", || async {
            (0..5).all(|i| log.calls(&format!("before-{i}")) == 1)
        })
        .await;
    }
    server.stop();
    tokio::time::sleep(Duration::from_millis(500)).await;
    // No persistence: Redis comes back empty, without the stream or the group.
    server.restart();
    let mut conn = manager(&server.url()).await;
    for i in 0..5 {
        xadd(&mut conn, "jobs", &format!("after-{i}"), "{}").await;
    }
    eventually("after the restart", || async {
        (0..5).all(|i| log.calls(&format!("after-{i}")) == 1)
    })
    .await;
    eventually("acked", || {
        let mut c = conn.clone();
        async move { pending(&mut c, "jobs").await == 0 }
    })
    .await;
    let report = worker.stop().await;
    assert_eq!(report.acked, 10);
    for i in 0..5 {
        assert_eq!(log.calls(&format!("before-{i}")), 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_are_listed_and_requeued_once() {
    let server = RedisServer::start();
    let mut conn = manager(&server.url()).await;
    let fixed = Arc::new(Mutex::new(false));
    let flag = fixed.clone();
    let log = Log::default();
    let svc = handler(&log, move |_| {
        if *flag.lock().unwrap() {
            Ok(Duration::ZERO)
        } else {
            Err(JobError::permanent("bug"))
        }
    });
    xadd(&mut conn, "jobs", "j", "payload").await;
    let worker = start!(Worker::connect(&server.url(), config("jobs", "w"), svc).unwrap());
    let dead = DeadLetters::new(conn.clone(), "jobs");
    eventually("dead-lettered", || async {
        dead.count().await.unwrap() == 1
    })
    .await;
    *fixed.lock().unwrap() = true;
    let letter = dead.list("-", 10).await.unwrap().remove(0);
    assert!(dead.requeue(&letter.dead_id).await.unwrap().is_some());
    assert_eq!(
        dead.requeue(&letter.dead_id).await.unwrap(),
        None,
        "requeued once"
    );
    eventually("processed", || async { log.calls("j") == 2 }).await;
    worker.stop().await;
    assert_eq!(dead.count().await.unwrap(), 0);
    assert_eq!(
        log.deliveries("j"),
        [1, 1],
        "a requeued job starts again at delivery 1"
    );
    assert_eq!(pending(&mut conn, "jobs").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trimming_never_deletes_a_pending_or_undelivered_entry() {
    let server = RedisServer::start();
    let mut conn = manager(&server.url()).await;
    let producer = Producer::new(conn.clone(), "jobs");
    redis::cmd("XGROUP")
        .arg("CREATE")
        .arg("jobs")
        .arg("workers")
        .arg("0")
        .arg("MKSTREAM")
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
    let mut ids = Vec::new();
    for i in 0..6 {
        ids.push(
            producer
                .enqueue(&JobId::new(format!("t{i}")).unwrap(), "{}")
                .await
                .unwrap(),
        );
    }
    // Deliver 4, acknowledge the 1st, 2nd and 4th: the 3rd stays pending, 5 and 6 undelivered.
    let _: Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg("workers")
        .arg("c")
        .arg("COUNT")
        .arg(4)
        .arg("STREAMS")
        .arg("jobs")
        .arg(">")
        .query_async(&mut conn)
        .await
        .unwrap();
    let _: u64 = redis::cmd("XACK")
        .arg("jobs")
        .arg("workers")
        .arg(&ids[0])
        .arg(&ids[1])
        .arg(&ids[3])
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        producer.trim_acknowledged().await.unwrap(),
        2,
        "only the two below the pending one"
    );
    let left: Vec<(String, Vec<String>)> = redis::cmd("XRANGE")
        .arg("jobs")
        .arg("-")
        .arg("+")
        .query_async(&mut conn)
        .await
        .unwrap();
    let left: Vec<&String> = left.iter().map(|(id, _)| id).collect();
    assert_eq!(left, ids[2..].iter().collect::<Vec<_>>());
    // No group at all: nothing is known to be processed, nothing is trimmed.
    let other = Producer::new(conn.clone(), "lonely");
    other
        .enqueue(&JobId::new("x").unwrap(), "{}")
        .await
        .unwrap();
    assert_eq!(other.trim_acknowledged().await.unwrap(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_three_master_cluster_runs_takes_over_and_dead_letters() {
    let cluster = RedisCluster::start();
    let client = redis::cluster::ClusterClient::new(cluster.urls()).unwrap();
    let mut conn = client.get_async_connection().await.unwrap();
    let log = Log::default();
    let svc = handler(&log, |job| {
        match (job.job_id().as_str(), job.deliveries()) {
            ("perm", _) => Err(JobError::permanent("no")),
            ("flaky", 1) => Err(JobError::transient("once")),
            _ => Ok(Duration::ZERO),
        }
    });
    // Several streams, so they land on different masters; a hash tag keeps each stream and
    // its dead-letter stream in one slot.
    let streams = ["{jobs-a}", "{jobs-b}", "{jobs-c}"];
    let mut workers = Vec::new();
    for stream in streams {
        for id in ["ok", "perm", "flaky"] {
            xadd(&mut conn, stream, &format!("{stream}{id}"), "{}").await;
        }
        let svc = tower::ServiceBuilder::new()
            .map_request(|job: Job| {
                // Strip the stream prefix so one handler serves all three.
                let id = job.job_id().as_str();
                let short = id.rsplit('}').next().unwrap_or(id).to_owned();
                Job::new(
                    job.stream_id(),
                    JobId::new(short).unwrap(),
                    job.payload().clone(),
                    job.deliveries(),
                )
            })
            .service(svc.clone());
        workers.push(start!(Worker::connect_cluster(
            cluster.urls(),
            config(stream, "c1"),
            svc
        )
        .await
        .unwrap()));
    }
    for stream in streams {
        let dead = DeadLetters::new(conn.clone(), stream);
        eventually("a dead letter per stream", || async {
            dead.count().await.unwrap() == 1
        })
        .await;
        eventually("nothing pending", || {
            let mut c = conn.clone();
            async move { pending(&mut c, stream).await == 0 }
        })
        .await;
        let letter = dead.list("-", 1).await.unwrap().remove(0);
        assert_eq!(letter.reason, "permanent");
        assert!(
            dead.requeue(&letter.dead_id).await.unwrap().is_some(),
            "same-slot requeue works on Cluster"
        );
    }
    eventually("requeued ones dead-lettered again", || async {
        log.calls("perm") == 6
    })
    .await;
    for w in workers {
        w.stop().await;
    }
    assert_eq!(log.calls("ok"), 3);
    let mut flaky = log.deliveries("flaky");
    flaky.sort_unstable();
    assert_eq!(flaky, [1, 1, 1, 2, 2, 2], "each flaky job taken over once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_run_leaves_no_task_or_connection_behind() {
    let server = RedisServer::start();
    let clients = || server.cli(&["CLIENT", "LIST"]).lines().count();
    let baseline = clients();
    let log = Log::default();
    let svc = handler(&log, |_| Ok(Duration::from_secs(60)));
    let running = start!(Worker::connect(&server.url(), config("jobs", "w"), svc).unwrap());
    let mut conn = manager(&server.url()).await;
    xadd(&mut conn, "jobs", "long", "{}").await;
    eventually("running", || async { log.calls("long") == 1 }).await;
    drop(conn);
    assert!(clients() > baseline);
    // The process "dies" as far as this worker is concerned: its run future is dropped.
    running.abort();
    eventually("every worker connection closed", || async {
        clients() == baseline
    })
    .await;
}

/// The batch's one `XPENDING` covers a range that can also hold this consumer's other pending
/// entries (left pending after transient failures, not yet idle). However many there are, every
/// taken-over entry must get its delivery count and run now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_takeover_batch_gets_its_delivery_counts_past_other_pending_entries() {
    let server = RedisServer::start();
    let mut conn = manager(&server.url()).await;
    redis::cmd("XGROUP")
        .arg("CREATE")
        .arg("jobs")
        .arg("workers")
        .arg("0")
        .arg("MKSTREAM")
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
    let mut ids = Vec::new();
    for i in 0..16 {
        ids.push(xadd(&mut conn, "jobs", &format!("e{i}"), "{}").await);
    }
    let _: Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg("workers")
        .arg("ghost")
        .arg("COUNT")
        .arg(16)
        .arg("STREAMS")
        .arg("jobs")
        .arg(">")
        .query_async(&mut conn)
        .await
        .unwrap();
    tokio::time::sleep(CLAIM_IDLE + Duration::from_millis(50)).await;
    // The middle 14 become fresh entries of "w" (idle 0); the first and last stay idle.
    let _: Value = redis::cmd("XCLAIM")
        .arg("jobs")
        .arg("workers")
        .arg("w")
        .arg(0)
        .arg(&ids[1..15])
        .arg("JUSTID")
        .query_async(&mut conn)
        .await
        .unwrap();
    let log = Log::default();
    let svc = handler(&log, ok);
    let worker =
        start!(Worker::connect(&server.url(), config("jobs", "w").concurrency(2), svc).unwrap());
    eventually("the first and last taken over", || async {
        log.calls("e0") == 1 && log.calls("e15") == 1
    })
    .await;
    eventually("all done", || async {
        (0..16).all(|i| log.calls(&format!("e{i}")) == 1)
    })
    .await;
    worker.stop().await;
    assert_eq!(log.deliveries("e0"), [2]);
    assert_eq!(
        log.deliveries("e15"),
        [2],
        "taken over at once, not one claim_idle later"
    );
}

/// Without a hash tag, a stream and its dead-letter stream live in different cluster slots: the
/// cluster refuses the `MULTI`, and the worker falls back to `XADD` then `XACK`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untagged_stream_on_a_cluster_still_dead_letters() {
    let cluster = RedisCluster::start();
    let slot = |key: &str| {
        cluster.nodes[0]
            .cli(&["CLUSTER", "KEYSLOT", key])
            .trim()
            .to_owned()
    };
    assert_ne!(
        slot("plainjobs"),
        slot("plainjobs:dead"),
        "the test needs two slots"
    );
    let client = redis::cluster::ClusterClient::new(cluster.urls()).unwrap();
    let mut conn = client.get_async_connection().await.unwrap();
    let log = Log::default();
    let svc = handler(&log, |_| Err(JobError::permanent("no")));
    xadd(&mut conn, "plainjobs", "p", "{}").await;
    let worker = start!(
        Worker::connect_cluster(cluster.urls(), config("plainjobs", "c"), svc)
            .await
            .unwrap()
    );
    let dead = DeadLetters::new(conn.clone(), "plainjobs");
    eventually("dead-lettered", || async {
        dead.count().await.unwrap() == 1
    })
    .await;
    eventually("acked", || {
        let mut c = conn.clone();
        async move { pending(&mut c, "plainjobs").await == 0 }
    })
    .await;
    assert_eq!(worker.stop().await.dead_lettered, 1);
    assert_eq!(log.calls("p"), 1);
    assert_eq!(dead.list("-", 1).await.unwrap()[0].reason, "permanent");
}

/// With persistence (AOF, fsync always), a restart mid-run loses nothing: entries waiting in
/// the stream and entries in flight during the outage all run and end acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_of_a_persistent_redis_loses_no_entry() {
    let aof = ["--appendonly", "yes", "--appendfsync", "always"];
    let mut server = RedisServer::start_with(free_port(), &aof);
    let log = Log::default();
    let svc = handler(&log, |_| Ok(Duration::from_millis(300)));
    {
        let mut conn = manager(&server.url()).await;
        for i in 0..6 {
            xadd(&mut conn, "jobs", &format!("p{i}"), "{}").await;
        }
    }
    let worker =
        start!(Worker::connect(&server.url(), config("jobs", "w").concurrency(2), svc).unwrap());
    eventually("a job in flight", || async {
        !log.0.lock().unwrap().is_empty()
    })
    .await;
    server.stop();
    tokio::time::sleep(Duration::from_millis(500)).await;
    server.restart();
    let mut conn = manager(&server.url()).await;
    eventually("every entry ran", || async {
        (0..6).all(|i| log.calls(&format!("p{i}")) >= 1)
    })
    .await;
    eventually("all acked", || {
        let mut c = conn.clone();
        async move { pending(&mut c, "jobs").await == 0 }
    })
    .await;
    worker.stop().await;
    let len: u64 = redis::cmd("XLEN")
        .arg("jobs")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(len, 6, "the stream survived");
    for i in 0..6 {
        // An ack lost in the outage means one redelivery (at least once), never a loss.
        let calls = log.calls(&format!("p{i}"));
        assert!((1..=2).contains(&calls), "p{i}: {calls} calls");
    }
    assert_eq!(
        DeadLetters::new(conn.clone(), "jobs")
            .count()
            .await
            .unwrap(),
        0
    );
}

/// The delivery's deadline is in scope for the handler: a `TimeoutLayer` inside with a 10 s
/// limit cuts a hung call at the 300 ms `job_deadline`, the error says it was the deadline,
/// and the entry stays pending.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_layer_inside_is_capped_by_the_job_deadline() {
    let server = RedisServer::start();
    let mut conn = manager(&server.url()).await;
    let hung = tower_once::timeout::TimeoutLayer::new(Duration::from_secs(10)).layer(
        tower::service_fn(|_job: Job| async {
            tokio::time::sleep(Duration::from_secs(60)).await;
            Ok::<_, JobError>(())
        }),
    );
    let cut_by_deadline = Arc::new(Mutex::new(None));
    let seen = cut_by_deadline.clone();
    let svc = tower::service_fn(move |job: Job| {
        let (hung, seen) = (hung.clone(), seen.clone());
        async move {
            let err = hung.oneshot(job).await.unwrap_err();
            *seen.lock().unwrap() = Some(err.elapsed().is_some_and(|e| e.is_deadline()));
            Err::<(), _>(JobError::transient(err.to_string()))
        }
    });
    xadd(&mut conn, "jobs", "hung", "{}").await;
    let config = config("jobs", "w")
        .job_deadline(Duration::from_millis(300))
        .claim_idle(Duration::from_secs(60));
    let worker = start!(Worker::connect(&server.url(), config, svc).unwrap());
    eventually("cut", || async {
        cut_by_deadline.lock().unwrap().is_some()
    })
    .await;
    let report = worker.stop().await;
    assert_eq!(
        *cut_by_deadline.lock().unwrap(),
        Some(true),
        "the deadline, not the 10 s limit"
    );
    assert_eq!(report.left_pending, 1);
    assert_eq!(pending(&mut conn, "jobs").await, 1);
}

/// A job still running when the shutdown grace ends is dropped, not acknowledged: it stays
/// pending for another worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_outliving_the_shutdown_grace_is_left_pending_not_acked() {
    let server = RedisServer::start();
    let mut conn = manager(&server.url()).await;
    let log = Log::default();
    let svc = handler(&log, |_| Ok(Duration::from_secs(60)));
    xadd(&mut conn, "jobs", "long", "{}").await;
    let config = config("jobs", "w").shutdown_grace(Duration::from_millis(200));
    let worker = start!(Worker::connect(&server.url(), config, svc).unwrap());
    eventually("running", || async { log.calls("long") == 1 }).await;
    let report = worker.stop().await;
    assert_eq!((report.abandoned, report.acked), (1, 0));
    assert_eq!(
        pending(&mut conn, "jobs").await,
        1,
        "left pending for another worker"
    );
}

/// An entry added while a stopping worker is blocked in `XREADGROUP` must not vanish into that
/// worker's pending list (where only a takeover, a `claim_idle` later, would find it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_added_during_shutdown_is_not_swallowed_by_the_stopping_worker() {
    let server = RedisServer::start();
    let mut conn = manager(&server.url()).await;
    let log = Log::default();
    let svc = handler(&log, ok);
    // A long claim_idle: a takeover cannot hide the problem.
    let config = |name: &str| {
        config("jobs", name)
            .claim_idle(Duration::from_secs(60))
            .block(Duration::from_secs(2))
    };
    let a = start!(Worker::connect(&server.url(), config("a"), svc.clone()).unwrap());
    eventually("a blocked in XREADGROUP", || async {
        server.cli(&["CLIENT", "LIST"]).contains("cmd=xreadgroup")
    })
    .await;
    let stopping = tokio::spawn(a.stop());
    xadd(&mut conn, "jobs", "late", "{}").await;
    stopping.await.unwrap();
    let b = start!(Worker::connect(&server.url(), config("b"), svc).unwrap());
    eventually("the late entry ran", || async { log.calls("late") == 1 }).await;
    b.stop().await;
    assert_eq!(log.deliveries("late"), [1]);
    assert_eq!(pending(&mut conn, "jobs").await, 0);
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transient_error_with_a_delay_is_redelivered_after_it_not_after_claim_idle() {
    let server = RedisServer::start();
    let mut conn = manager(&server.url()).await;
    let log = Log::default();
    // The upstream says "retry in 300 ms" once; claim_idle is a minute, so without the delay
    // the second delivery would come a minute later, after this test gave up.
    let svc = handler(&log, |job| {
        if job.deliveries() == 1 {
            Err(JobError::transient("429 from upstream")
                .redeliver_after(Duration::from_millis(300)))
        } else {
            Ok(Duration::ZERO)
        }
    });
    // Longer than claim_idle: cut to it, so held back exactly as without a delay.
    let long = handler(&log, |_| {
        Err(JobError::transient("503").redeliver_after(Duration::from_secs(3600)))
    });
    xadd(&mut conn, "soon", "job-soon", "{}").await;
    xadd(&mut conn, "late", "job-late", "{}").await;
    let minute = Duration::from_secs(60);
    let soon = start!(Worker::connect(
        &server.url(),
        config("soon", "w1")
            .claim_idle(minute)
            .block(Duration::from_millis(100)),
        svc
    )
    .unwrap());
    let late = start!(Worker::connect(
        &server.url(),
        config("late", "w1")
            .claim_idle(minute)
            .block(Duration::from_millis(100)),
        long
    )
    .unwrap());
    eventually("the early second delivery", || async {
        log.calls("job-soon") == 2
    })
    .await;
    eventually("the acknowledgement", || async {
        pending(&mut conn.clone(), "soon").await == 0
    })
    .await;
    assert_eq!(log.deliveries("job-soon"), [1, 2]);
    eventually("the long one failed once", || async {
        log.calls("job-late") == 1
    })
    .await;
    // Its idle time starts over (held back a whole claim_idle), not past it.
    let (_, idle_ms) = first_pending(&mut conn, "late").await;
    assert!((0..30_000).contains(&idle_ms), "idle {idle_ms} ms");
    soon.stop().await;
    late.stop().await;
    assert_eq!(log.calls("job-late"), 1, "not redelivered early");
}

/// HOLDS (README "Retries that cannot become a storm": the deadline and the attempt's mark
/// travel with the worker's `Job` across tasks and channels; worker crate docs: "one delivery
/// = one call with a fresh per-delivery deadline"): a real `Worker` whose handler stack is a
/// `RetryLayer` (10 attempts, a retry every 300 ms, its own 30 s deadline), then a channel to a
/// pool task that runs each job on a spawned task of its own, then another `RetryLayer` and a
/// `TimeoutLayer` over a handler that always fails. With a 1 s `job_deadline` the outer layer
/// makes at most 4 attempts (at 0, 0.3, 0.6, 0.9 s) and the inner one defers to it: at most 4
/// handler calls for the delivery, where a lost deadline would give 10 and a lost mark 4 × 4.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_job_deadline_and_attempt_mark_cross_a_channel_and_a_task_in_the_workers_stack() {
    use tower_once::retry::backoff::Jitter;
    use tower_once::timeout::TimeoutLayer;
    let server = RedisServer::start();
    let conn = manager(&server.url()).await;
    let log = Log::default();
    let failing = handler(&log, |_| Err(JobError::transient("upstream 503")));
    let inner = RetryLayer::new()
        .no_budget()
        .backoff(Backoff::new(Duration::from_millis(1), 1.0, Duration::from_millis(1)).unwrap())
        .layer(TimeoutLayer::new(Duration::from_secs(5)).layer(failing));
    // A pool: jobs go over a channel to a task that runs each on a task of its own.
    type Reply = tokio::sync::oneshot::Sender<Result<(), String>>;
    let (queue, mut jobs) = tokio::sync::mpsc::channel::<(Job, Reply)>(16);
    tokio::spawn(async move {
        while let Some((job, reply)) = jobs.recv().await {
            let inner = inner.clone();
            tokio::spawn(async move {
                let outcome = inner.oneshot(job).await.map_err(|e| e.to_string());
                let _ = reply.send(outcome);
            });
        }
    });
    let pooled = tower::service_fn(move |job: Job| {
        let queue = queue.clone();
        async move {
            let (reply, answer) = tokio::sync::oneshot::channel();
            queue
                .send((job, reply))
                .await
                .map_err(|_| JobError::transient("pool gone"))?;
            answer
                .await
                .map_err(|_| JobError::transient("pool dropped the job"))?
                .map_err(JobError::transient)
        }
    });
    let svc = RetryLayer::new()
        .no_budget()
        .max_attempts(10)
        .backoff(
            Backoff::new(Duration::from_millis(300), 1.0, Duration::from_millis(300))
                .unwrap()
                .jitter(Jitter::None),
        )
        .layer(pooled);
    Producer::new(conn.clone(), "jobs")
        .enqueue(&JobId::new("deadline-1").unwrap(), "{}")
        .await
        .unwrap();
    let config = WorkerConfig::new("jobs", "workers")
        .consumer("w1")
        .claim_idle(Duration::from_secs(60))
        .job_deadline(Duration::from_secs(1))
        .shutdown_grace(Duration::from_secs(10));
    let worker = start!(Worker::connect(&server.url(), config, svc).unwrap());
    eventually("the delivery started", || async {
        log.calls("deadline-1") > 0
    })
    .await;
    // Long after a deadline-blind stack would have made all its attempts (2.7 s).
    tokio::time::sleep(Duration::from_secs(4)).await;
    let report = worker.stop().await;
    let calls = log.calls("deadline-1");
    assert!(
        (1..=4).contains(&calls),
        "{calls} handler calls for one delivery with a 1 s deadline"
    );
    assert_eq!(log.deliveries("deadline-1"), vec![1; calls], "one delivery");
    assert_eq!(report.acked, 0);
}
