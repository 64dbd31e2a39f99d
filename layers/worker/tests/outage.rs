//! Redis going away (worker crate docs "Semantics": while Redis is unreachable the worker backs
//! off, reconnects and recreates the group if it was lost): a restarted Redis, with or without
//! persistence, and no entry lost.

mod support;

use std::time::Duration;
use support::{config, eventually, handler, manager, ok, pending, start, xadd, Log};
use tower_once_test_support::ports::free_port;
use tower_once_test_support::redis::RedisServer;
use tower_once_worker::dead_letter::DeadLetters;
use tower_once_worker::redis;
use tower_once_worker::Worker;

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
