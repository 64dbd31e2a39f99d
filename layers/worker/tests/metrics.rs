//! The worker's `metrics` names and labels (worker crate docs, "Feature flags"; facade crate docs
//! "Metrics") against a real `redis-server`, checked with a recording backend. Its own test binary,
//! as the recorder is process-global.
#![cfg(feature = "metrics")]

use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use std::time::{Duration, Instant};
use tower_once_test_support::redis::RedisServer;
use tower_once_worker::redis::{self, aio::ConnectionManager};
use tower_once_worker::{Job, JobError, Worker, WorkerConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_reports_with_stable_names() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder
        .install()
        .expect("the only recorder in this binary");

    let server = RedisServer::start();
    let mut conn = ConnectionManager::new(redis::Client::open(server.url()).unwrap())
        .await
        .unwrap();
    for id in ["ok", "perm", "flaky"] {
        let _: String = redis::cmd("XADD")
            .arg("jobs")
            .arg("*")
            .arg("job_id")
            .arg(id)
            .arg("payload")
            .arg("{}")
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    let svc = tower::service_fn(|job: Job| async move {
        match (job.job_id().as_str(), job.deliveries()) {
            ("perm", _) => Err(JobError::permanent("no")),
            ("flaky", 1) => Err(JobError::transient("once")),
            _ => Ok(()),
        }
    });
    let config = WorkerConfig::new("jobs", "workers").claim_idle(Duration::from_millis(300));
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let worker = tokio::spawn(
        Worker::connect(&server.url(), config, svc)
            .unwrap()
            .run(async {
                let _ = rx.await;
            }),
    );
    // Done when nothing is pending and the permanent failure is dead-lettered.
    let started = Instant::now();
    loop {
        let pending: redis::Value = redis::cmd("XPENDING")
            .arg("jobs")
            .arg("workers")
            .query_async(&mut conn)
            .await
            .unwrap_or(redis::Value::Nil); // NOGROUP until the worker made the group
        let dead: u64 = redis::cmd("XLEN")
            .arg("jobs:dead")
            .query_async(&mut conn)
            .await
            .unwrap();
        let idle = matches!(pending, redis::Value::Array(ref p) if p.first() == Some(&redis::Value::Int(0)));
        if idle && dead == 1 {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "timed out");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = tx.send(());
    worker.await.unwrap();
    let rows: Vec<(String, f64)> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| {
            let key = key.key();
            let labels: Vec<_> = key
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            let value = match value {
                DebugValue::Counter(n) => n as f64,
                DebugValue::Gauge(g) => g.into_inner(),
                DebugValue::Histogram(s) => s.len() as f64,
            };
            (format!("{}{{{}}}", key.name(), labels.join(",")), value)
        })
        .collect();
    let get = |name: &str| rows.iter().find(|(k, _)| k == name).map(|(_, v)| *v);
    assert_eq!(get("tower_once_worker_processed_total{}"), Some(2.0));
    assert_eq!(get("tower_once_worker_failed_total{}"), Some(2.0));
    assert_eq!(get("tower_once_worker_redelivered_total{}"), Some(1.0));
    assert_eq!(
        get("tower_once_worker_dead_lettered_total{reason=permanent}"),
        Some(1.0)
    );
    assert_eq!(
        get("tower_once_worker_in_flight{}"),
        Some(0.0),
        "every handler finished"
    );
    assert_eq!(
        get("tower_once_worker_group_lag{}"),
        Some(0.0),
        "every entry delivered"
    );
}
