//! Attacks on the worker example as separate processes (the issue's CLI contract) against a
//! real `redis-server`. A FAILING test demonstrates a broken guarantee; passing ones are marked
//! HOLDS. Every wait is a bounded poll.
#![cfg(feature = "worker")]

mod support;

use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};
use tower_once_test_support::redis::RedisServer;

const CLAIM_IDLE_MS: &str = "400";
const LIMIT: Duration = Duration::from_secs(40);

struct WorkerProcess {
    child: Option<Child>,
}

impl WorkerProcess {
    fn start(server: &RedisServer, args: &[&str]) -> Self {
        let binary = support::example_binary_with("worker", "worker");
        let child = Command::new(binary)
            .args(["--redis", &server.url(), "--claim-idle-ms", CLAIM_IDLE_MS])
            .args(args)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the worker example");
        Self { child: Some(child) }
    }

    fn terminate(&mut self) -> ExitStatus {
        let mut child = self.child.take().expect("running");
        let status = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
        let started = Instant::now();
        loop {
            if let Some(status) = child.try_wait().expect("wait") {
                return status;
            }
            assert!(
                started.elapsed() < LIMIT,
                "the worker did not exit after SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn xadd(server: &RedisServer, stream: &str, job_id: &str, payload: &str) -> String {
    server
        .cli(&["XADD", stream, "*", "job_id", job_id, "payload", payload])
        .trim()
        .to_owned()
}

fn counter(server: &RedisServer, key: &str) -> u64 {
    server.cli(&["GET", key]).trim().parse().unwrap_or(0)
}

fn pending(server: &RedisServer, stream: &str) -> u64 {
    let out = server.cli(&["XPENDING", stream, "workers"]);
    out.lines()
        .next()
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or(0)
}

fn xlen(server: &RedisServer, stream: &str) -> u64 {
    server.cli(&["XLEN", stream]).trim().parse().unwrap_or(0)
}

fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let started = Instant::now();
    while !check() {
        assert!(started.elapsed() < LIMIT, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// Was a break found by the attack, now fixed (the library test
/// `attack_worker::a_duplicate_enqueued_during_a_long_run_...`, through
/// the example's contract). "With `--run-once`, a job id whose effect is done is acknowledged
/// without running again" and "a concurrent second delivery waits or is acknowledged as
/// duplicate": the same job id enqueued twice while its first run (4 s) outlasts
/// `claim_idle * max_deliveries` (400 ms * 2) ends with the duplicate in `jobs:dead`.
#[test]
fn a_duplicate_enqueued_during_a_long_run_is_not_dead_lettered() {
    let server = RedisServer::start();
    xadd(&server, "jobs", "dup", r#"{"action":"sleep","ms":4000}"#);
    xadd(&server, "jobs", "dup", r#"{"action":"sleep","ms":4000}"#);
    let _w = WorkerProcess::start(
        &server,
        &["--run-once", "--max-deliveries", "2", "--concurrency", "4"],
    );
    eventually("the effect and nothing pending", || {
        counter(&server, "effects:dup") == 1 && pending(&server, "jobs") == 0
    });
    assert_eq!(counter(&server, "runs:dup"), 1, "one run (holds)");
    assert_eq!(
        xlen(&server, "jobs:dead"),
        0,
        "a duplicate of a job that succeeded was dead-lettered: {}",
        server.cli(&["XRANGE", "jobs:dead", "-", "+"])
    );
}

/// A known limit found by the attack (ignored; in the worker docs and issue 11's note)
/// (intermittent: observed failing in 1 of 4 single-round runs, so this repeats the
/// scenario for up to 5 rounds). Issue 11: "a slow but live worker keeps its job". Redis frozen
/// (SIGSTOP) for 5x `claim_idle` while a live worker ("a", `--run-once`) runs a long job and a
/// second worker ("b") waits: after SIGCONT the entry's idle time and the run-once claim's TTL
/// (both wall clock) have run out, and whichever `XAUTOCLAIM` Redis executes before the live
/// worker's refresh takes the running job over (delivery 2); the run-once claim has expired, so
/// the handler runs a second time while the first is still running.
#[test]
#[ignore = "known limit (worker docs): Redis frozen longer than claim_idle can hand a live job to a second run"]
fn redis_frozen_longer_than_claim_idle_hands_a_live_job_to_a_second_run() {
    let mut server = RedisServer::start();
    let _a = WorkerProcess::start(&server, &["--run-once", "--consumer", "a"]);
    let _b = WorkerProcess::start(&server, &["--run-once", "--consumer", "b"]);
    for round in 0..5 {
        let id = format!("long-{round}");
        xadd(&server, "jobs", &id, r#"{"action":"sleep","ms":3000}"#);
        eventually("the job running", || {
            counter(&server, &format!("runs:{id}")) == 1
        });
        std::thread::sleep(Duration::from_millis(500));
        server.signal("-STOP");
        std::thread::sleep(Duration::from_millis(2000));
        server.signal("-CONT");
        eventually("the effect", || {
            counter(&server, &format!("effects:{id}")) >= 1
        });
        eventually("nothing pending", || pending(&server, "jobs") == 0);
        // A second run, if any, finishes too (its entry may already be acknowledged by the first
        // run's XACK, which does not check ownership).
        eventually("runs settle", || {
            counter(&server, &format!("runs:{id}")) == counter(&server, &format!("effects:{id}"))
        });
        let (runs, effects) = (
            counter(&server, &format!("runs:{id}")),
            counter(&server, &format!("effects:{id}")),
        );
        assert_eq!(
            (runs, effects),
            (1, 1),
            "round {round}: the live worker lost its running job after a 2 s Redis freeze \
             (claim_idle {CLAIM_IDLE_MS} ms): runs {runs}, effects {effects}, deliveries {}",
            counter(&server, &format!("deliveries:{id}"))
        );
    }
    assert_eq!(xlen(&server, "jobs:dead"), 0);
    server.stop();
}

/// HOLDS. SIGTERM while Redis is frozen: the worker still exits 0 (bounded by its command
/// timeouts), and after SIGCONT a new worker finishes what was left (at least once).
#[test]
fn sigterm_while_redis_is_frozen_still_exits_zero() {
    let server = RedisServer::start();
    let mut w = WorkerProcess::start(&server, &["--concurrency", "2"]);
    xadd(&server, "jobs", "f0", r#"{"action":"sleep","ms":300}"#);
    eventually("f0 done", || counter(&server, "effects:f0") == 1);
    xadd(&server, "jobs", "f1", r#"{"action":"sleep","ms":3000}"#);
    eventually("f1 running", || counter(&server, "runs:f1") == 1);
    server.signal("-STOP");
    let status = w.terminate();
    server.signal("-CONT");
    assert!(status.success(), "{status:?}");
    let _next = WorkerProcess::start(&server, &["--consumer", "next"]);
    eventually("f1 done", || counter(&server, "effects:f1") >= 1);
    eventually("nothing pending", || pending(&server, "jobs") == 0);
    // At least once, not exactly once: the stopping worker's `INCR effects:f1` sat in its
    // socket while Redis was frozen, its handler gave up (transient), and Redis applied the
    // INCR after SIGCONT; the redelivery ran it again (effects 2 was observed). That is the
    // documented run-without-run-once contract, not a worker bug.
    assert!(counter(&server, "effects:f1") <= 2);
}

/// HOLDS. SIGTERM mid-batch with concurrency 4 and a shutdown grace shorter than the jobs:
/// exit 0, nothing acknowledged unprocessed (no effect, every entry still pending or unread),
/// and a second worker runs each job to one effect.
#[test]
fn shutdown_grace_expiring_mid_batch_acks_nothing_unprocessed() {
    let server = RedisServer::start();
    let mut w = WorkerProcess::start(
        &server,
        &["--concurrency", "4", "--shutdown-grace-ms", "300"],
    );
    let ids: Vec<String> = (0..8).map(|i| format!("g{i}")).collect();
    for id in &ids {
        xadd(&server, "jobs", id, r#"{"action":"sleep","ms":4000}"#);
    }
    eventually("four running", || {
        ids.iter()
            .map(|id| counter(&server, &format!("runs:{id}")))
            .sum::<u64>()
            == 4
    });
    let status = w.terminate();
    assert!(status.success(), "{status:?}");
    let started: u64 = ids
        .iter()
        .map(|id| counter(&server, &format!("runs:{id}")))
        .sum();
    assert_eq!(started, 4, "never more than --concurrency handlers");
    assert_eq!(
        pending(&server, "jobs"),
        4,
        "the abandoned four stay pending"
    );
    for id in &ids {
        assert_eq!(counter(&server, &format!("effects:{id}")), 0);
    }
    let _next = WorkerProcess::start(&server, &["--consumer", "next", "--concurrency", "8"]);
    eventually("all done", || {
        ids.iter()
            .all(|id| counter(&server, &format!("effects:{id}")) == 1)
    });
    eventually("nothing pending", || pending(&server, "jobs") == 0);
    assert_eq!(xlen(&server, "jobs:dead"), 0);
}

/// HOLDS. A worker SIGKILLed mid-job and restarted under the same consumer name, while its old
/// entry is pending in its own name: the new process (which never reads its own pending list
/// with `0`) takes it over after `claim_idle` as delivery 2; with `--run-once` one effect.
#[test]
fn restarted_under_the_same_name_takes_back_its_own_pending_entry() {
    let server = RedisServer::start();
    let mut old = WorkerProcess::start(&server, &["--run-once", "--consumer", "same"]);
    xadd(&server, "jobs", "mine", r#"{"action":"sleep","ms":1500}"#);
    eventually("running", || counter(&server, "runs:mine") == 1);
    if let Some(mut child) = old.child.take() {
        child.kill().unwrap();
        child.wait().unwrap();
    }
    let _new = WorkerProcess::start(&server, &["--run-once", "--consumer", "same"]);
    eventually("done", || counter(&server, "effects:mine") == 1);
    eventually("nothing pending", || pending(&server, "jobs") == 0);
    assert_eq!(counter(&server, "runs:mine"), 2);
    assert_eq!(counter(&server, "deliveries:mine"), 2);
    assert_eq!(counter(&server, "effects:mine"), 1);
}
