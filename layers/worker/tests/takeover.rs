//! Takeover (worker crate docs: a crashed worker's entry is taken over after
//! `claim_idle` with its delivery count + 1; the live worker refreshes its claim, so only dead
//! workers lose jobs), against real `redis-server` processes. Each test counts handler calls; Redis
//! idle times are real time, so `claim_idle` is short and every wait is a bounded poll.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::{
    config, create_group, dead_letters, eventually, handler, manager, ok, pending, start, xadd,
    Log, Tap, CLAIM_IDLE,
};
use tokio::time::Instant;
use tower_once_test_support::redis::RedisServer;
use tower_once_worker::redis::{self, Value};
use tower_once_worker::Worker;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_dead_right_after_xreadgroup_loses_its_entry_only_after_claim_idle() {
    let server = RedisServer::start();
    let mut conn = manager(&server.url()).await;
    create_group(&mut conn, "jobs", "workers").await;
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

/// The batch's one `XPENDING` covers a range that can also hold this consumer's other pending
/// entries (left pending after transient failures, not yet idle). However many there are, every
/// taken-over entry must get its delivery count and run now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_takeover_batch_gets_its_delivery_counts_past_other_pending_entries() {
    let server = RedisServer::start();
    let mut conn = manager(&server.url()).await;
    create_group(&mut conn, "jobs", "workers").await;
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

/// A worker never hands itself a job it is running, even when the refresh cannot reach Redis for a
/// while (here the script calls fail, as with a command timeout, a Redis that refuses `EVALSHA`, or
/// a scripting ACL): its own `XAUTOCLAIM` takeover skips the entries in its in-flight set. Was
/// broken: `take_over` did not skip them, so the worker called the handler again, concurrently, in
/// the same process (then dead-lettered the entry as `max_deliveries` while the first call was
/// still running).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_never_takes_over_its_own_running_entry_when_a_refresh_fails() {
    let server = RedisServer::start();
    let mut conn = manager(&server.url()).await;
    let log = Log::default();
    let svc = handler(&log, |_| Ok(Duration::from_millis(1500)));
    let reader = Tap::new(manager(&server.url()).await);
    let mut writer = Tap::new(manager(&server.url()).await);
    writer.fail_cmds = &["EVALSHA", "EVAL", "SCRIPT"];
    xadd(&mut conn, "self", "slow-1", "{}").await;
    let worker =
        start!(Worker::new(config("self", "w").max_deliveries(3), reader, writer, svc).unwrap());
    eventually("finished", || {
        let mut conn = conn.clone();
        async move { pending(&mut conn, "self").await == 0 }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1600)).await;
    worker.stop().await;
    let dead = dead_letters(&mut conn, "self").await;
    assert_eq!(
        log.calls("slow-1"),
        1,
        "one process ran its own entry {} times (deliveries seen {:?}); dead letters {dead:?}",
        log.calls("slow-1"),
        log.0.lock().unwrap().get("slow-1")
    );
}
