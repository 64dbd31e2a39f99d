//! Dead letters (worker crate docs, worker crate docs "Semantics": an entry with no
//! valid `job_id` is dead-lettered with `reason` `malformed`, its handler not called;
//! `DeadLetters::list` and `DeadLetters::requeue` let a person send them back), against real
//! `redis-server` processes. Each test counts handler calls.

mod support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::{
    config, create_group, dead_letters, eventually, handler, manager, pending, start, xadd,
    xadd_fields, Log,
};
use tower_once_test_support::redis::RedisServer;
use tower_once_worker::dead_letter::DeadLetters;
use tower_once_worker::redis::{self, Value};
use tower_once_worker::{JobError, Worker};

/// Poison entries — no job_id, an empty, non-ASCII, non-UTF-8 or 256-byte job_id, odd
/// field names, a duplicated job_id field, a non-UTF-8 payload, a 6 MiB payload — and an entry
/// deleted (`XDEL`) while pending in a dead consumer: each valid job runs once, each malformed
/// one is dead-lettered unrun, nothing stays pending and the worker keeps going.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_entries_are_dead_lettered_unrun_and_nothing_sticks() {
    let server = RedisServer::start();
    let mut conn = manager(&server.url()).await;
    let log = Log::default();
    let seen_payload = Arc::new(Mutex::new(HashMap::<String, usize>::new()));
    let seen = seen_payload.clone();
    let svc = handler(&log, move |job| {
        seen.lock()
            .unwrap()
            .insert(job.job_id().to_string(), job.payload().len());
        Ok(Duration::ZERO)
    });
    // An entry pending in a consumer that died, then deleted from the stream.
    create_group(&mut conn, "poison", "workers").await;
    let ghost = xadd(&mut conn, "poison", "ghost-1", "{}").await;
    let _: Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg("workers")
        .arg("dead-consumer")
        .arg("STREAMS")
        .arg("poison")
        .arg(">")
        .query_async(&mut conn)
        .await
        .unwrap();
    let _: Value = redis::cmd("XDEL")
        .arg("poison")
        .arg(&ghost)
        .query_async(&mut conn)
        .await
        .unwrap();
    let huge = vec![b'x'; 6 << 20];
    let long_id = "i".repeat(256);
    let malformed: Vec<Vec<(&[u8], &[u8])>> = vec![
        vec![(b"payload", b"{}")],
        vec![(b"job_id", b""), (b"payload", b"{}")],
        vec![(b"job_id", "é".as_bytes())],
        vec![(b"job_id", b"\xff\xfe"), (b"payload", b"{}")],
        vec![(b"job_id", long_id.as_bytes())],
        vec![(b"job_id", b"has space")],
        vec![(b"\xff\x00", b"job_id"), (b"", b"")],
    ];
    for fields in &malformed {
        xadd_fields(&mut conn, "poison", fields).await;
    }
    xadd_fields(
        &mut conn,
        "poison",
        &[
            (b"job_id", b"dup-field"),
            (b"job_id", b"second"),
            (b"payload", b"p"),
        ],
    )
    .await;
    xadd_fields(
        &mut conn,
        "poison",
        &[(b"job_id", b"binary"), (b"payload", b"\xff\x00\xfe")],
    )
    .await;
    xadd_fields(
        &mut conn,
        "poison",
        &[(b"job_id", b"huge"), (b"payload", &huge)],
    )
    .await;
    let n_malformed = malformed.len();
    let worker = start!(Worker::connect(&server.url(), config("poison", "w"), svc).unwrap());
    eventually("all handled", || {
        let mut conn = conn.clone();
        async move {
            pending(&mut conn, "poison").await == 0
                && dead_letters(&mut conn, "poison").await.len() >= n_malformed
        }
    })
    .await;
    // The worker is still alive: a later job runs.
    xadd(&mut conn, "poison", "after", "{}").await;
    eventually("a later job", || async { log.calls("after") == 1 }).await;
    worker.stop().await;
    let dead = dead_letters(&mut conn, "poison").await;
    assert_eq!(dead.len(), malformed.len(), "{dead:?}");
    assert!(
        dead.iter()
            .all(|d| d.get("reason").map(String::as_str) == Some("malformed")),
        "{dead:?}"
    );
    assert_eq!(log.calls("dup-field"), 1);
    assert_eq!(log.calls("binary"), 1);
    assert_eq!(log.calls("huge"), 1);
    assert_eq!(seen_payload.lock().unwrap().get("huge"), Some(&(6 << 20)));
    assert_eq!(log.calls("ghost-1"), 0, "a deleted entry is not run");
    assert_eq!(log.total(), 4, "only the valid jobs ran");
    assert_eq!(pending(&mut conn, "poison").await, 0);
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
