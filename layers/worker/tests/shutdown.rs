//! Graceful shutdown (worker crate docs "Semantics": stop reading, a read in progress finishes
//! within `BLOCK`; in-flight jobs finish within the grace period and are acknowledged; the rest
//! stay pending), against real `redis-server` processes: nothing is lost, nothing unprocessed is
//! acknowledged, and a dropped run leaves nothing behind.

mod support;

use std::time::Duration;
use support::{config, eventually, handler, manager, ok, pending, start, xadd, Log};
use tower_once_test_support::redis::RedisServer;
use tower_once_worker::Worker;

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
