//! The demo server on Postgres as real processes (idempotency crate docs "Choosing a store": with
//! `--postgres` each charge commits in one transaction with its idempotency record, so a crash
//! at any step leaves either both or neither): SIGKILL after the charge is written but before
//! the commit, and after the commit but before the answer; a replica frozen (SIGSTOP) past its
//! lease while a retry goes to another; a replica killed in the middle of a load of retrying
//! clients. Effects are counted in the `charges` table.
#![cfg(feature = "postgres")]

mod support;

use std::time::{Duration, Instant};
use support::{http, DemoServer};
use tower_once_test_support::postgres::Database;

const ORDER: &str = r#"{"order_id":"A","amount":500}"#;

fn start(db: &Database) -> DemoServer {
    DemoServer::start(&["--postgres", &db.url(), "--lease-ms", "1000"])
}

fn post(server: &DemoServer, query: &str, key: &str) -> (u16, String) {
    http(
        "POST",
        &format!("{}/charges{query}", server.base()),
        &[
            ("idempotency-key", key),
            ("content-type", "application/json"),
        ],
        ORDER,
    )
}

/// Sends a request with `extra` header lines and does not read its answer (the server is
/// killed or frozen while it runs).
fn send_and_forget(
    server: &DemoServer,
    query: &str,
    extra: &str,
    key: &str,
) -> std::net::TcpStream {
    use std::io::Write;
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", server.port)).unwrap();
    let request = format!(
        "POST /charges{query} HTTP/1.1\r\nHost: x\r\nidempotency-key: {key}\r\n{extra}\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n{ORDER}",
        ORDER.len()
    );
    stream.write_all(request.as_bytes()).unwrap();
    stream
}

/// Retries `key` until it is answered `201` (a `409` while a dead owner's lease runs out);
/// returns the body and whether it was a replay.
fn retry_until_created(server: &DemoServer, query: &str, key: &str) -> String {
    let started = Instant::now();
    loop {
        let (status, body) = post(server, query, key);
        if status == 201 {
            return body;
        }
        assert!(status == 409 || status == 503, "{status}: {body}");
        assert!(started.elapsed() < Duration::from_secs(20), "never created");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < Duration::from_secs(20), "{what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn charges(db: &Database) -> u64 {
    db.count("SELECT count(*) FROM charges")
}

#[test]
fn killed_after_the_charge_but_before_the_commit_the_retry_charges_once() {
    let db = Database::create();
    let mut server = start(&db);
    let _pending = send_and_forget(&server, "", "x-commit-delay-ms: 30000\r\n", "crash-1");
    // The charge is written, uncommitted: the handler waits before the commit of its record.
    eventually("the handler's open transaction", || {
        db.count(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE datname = current_database() AND state = 'idle in transaction'",
        ) >= 1
    });
    server.kill();
    assert_eq!(charges(&db), 0, "nothing committed");
    // The dead process's connection closes with it, and Postgres rolls its transaction back,
    // the key's lock with it: no lease to wait out.
    eventually("the dead owner's transaction rolled back", || {
        db.count(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE datname = current_database() AND state = 'idle in transaction'",
        ) == 0
    });
    let server = start(&db);
    let (status, body) = post(&server, "", "crash-1");
    assert_eq!(status, 201, "the first retry runs at once: {body}");
    assert!(body.contains("\"order_id\":\"A\""), "{body}");
    assert_eq!(charges(&db), 1);
    let (status, again) = post(&server, "", "crash-1");
    assert_eq!((status, again), (201, body), "later retries replay it");
    assert_eq!(charges(&db), 1);
    assert_eq!(
        db.query("SELECT state FROM idempotency_records"),
        "completed"
    );
}

#[test]
fn killed_after_the_commit_but_before_the_answer_the_retry_replays() {
    let db = Database::create();
    let mut server = start(&db);
    let _pending = send_and_forget(&server, "", "x-respond-delay-ms: 30000\r\n", "crash-2");
    eventually("the commit", || charges(&db) == 1);
    assert_eq!(
        db.query("SELECT state FROM idempotency_records"),
        "completed"
    );
    server.kill();
    let server = start(&db);
    let (status, body) = post(&server, "", "crash-2");
    assert_eq!(status, 201, "{body}");
    let id = db.query("SELECT id FROM charges");
    assert!(
        body.contains(&format!("ch_{:0>6}", id)),
        "the committed charge: {body}"
    );
    assert_eq!(charges(&db), 1, "no second charge");
}

#[test]
fn a_replica_frozen_past_its_lease_never_commits_a_second_charge() {
    let db = Database::create();
    let frozen = start(&db);
    let other = start(&db);
    // Claimed on the first replica (its transaction open, holding the key's lock); its handler
    // waits before charging, and the process is frozen in there for longer than its lease,
    // which bounds how long a transaction may sit idle: Postgres ends it, and the key is free.
    let mut pending = send_and_forget(&frozen, "?delay_ms=500", "", "freeze-1");
    std::thread::sleep(Duration::from_millis(200));
    frozen.signal("STOP");
    std::thread::sleep(Duration::from_millis(1500));
    let body = retry_until_created(&other, "?delay_ms=500", "freeze-1");
    assert_eq!(charges(&db), 1);
    frozen.signal("CONT");
    // The frozen replica wakes and charges on a connection Postgres has closed: nothing
    // commits, and it answers 503.
    use std::io::Read;
    pending
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut answer = String::new();
    let mut buf = [0; 4096];
    while !answer.contains("\r\n\r\n") {
        let n = pending.read(&mut buf).unwrap();
        assert!(n > 0, "the frozen replica answered: {answer}");
        answer.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert_eq!(charges(&db), 1, "the stale owner's charge never committed");
    let (status, again) = post(&other, "?delay_ms=500", "freeze-1");
    assert_eq!((status, again), (201, body));
}

#[test]
fn a_replica_killed_under_load_leaves_every_charge_once() {
    let db = Database::create();
    let mut first = start(&db);
    let second = start(&db);
    let keys: Vec<String> = (0..120).map(|i| format!("load-{i}")).collect();
    let (port_a, port_b) = (first.port, second.port);
    let workers: Vec<_> = keys
        .chunks(20)
        .enumerate()
        .map(|(w, chunk)| {
            let chunk = chunk.to_vec();
            std::thread::spawn(move || {
                for key in chunk {
                    // Alternate replicas; a refused connection (the killed one) goes to the other.
                    let mut port = if w % 2 == 0 { port_a } else { port_b };
                    let started = Instant::now();
                    loop {
                        let url = format!("http://127.0.0.1:{port}/charges?delay_ms=5");
                        let answered = std::panic::catch_unwind(|| {
                            http("POST", &url, &[("idempotency-key", &key)], ORDER)
                        });
                        match answered {
                            Ok((201, _)) => break,
                            Ok((409 | 503, _)) => std::thread::sleep(Duration::from_millis(50)),
                            Ok((status, body)) => panic!("{status}: {body}"),
                            Err(_) => port = port_b,
                        }
                        assert!(
                            started.elapsed() < Duration::from_secs(60),
                            "{key} never created"
                        );
                    }
                }
            })
        })
        .collect();
    eventually("some charges", || charges(&db) >= 20);
    first.kill();
    for worker in workers {
        worker.join().unwrap();
    }
    assert_eq!(charges(&db), 120, "every key charged once");
    assert_eq!(
        db.count("SELECT count(*) FROM idempotency_records WHERE state = 'completed'"),
        120
    );
    drop(second);
}
