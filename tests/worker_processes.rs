//! The worker example as separate processes (worker crate docs: its flags, the
//! `runs:<job_id>` and `effects:<job_id>` counters it keeps in Redis, `--run-once`, SIGTERM; the
//! worker crate docs' "Known limits") against a real `redis-server`: entries added with `XADD`,
//! effects counted in Redis, workers killed with SIGKILL, stopped with SIGTERM, restarted under the
//! same name, or left running while Redis freezes. Every wait is a bounded poll; nothing asserts on
//! timing.
#![cfg(feature = "worker")]

mod support;

use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};
use tower_once_test_support::redis::RedisServer;

/// Short enough for quick takeovers, long enough for a loaded 2-core machine.
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

    fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// SIGKILL: no shutdown, no ack, no refresh: the process is simply gone.
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM, then waits (bounded) for the exit.
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
        self.kill();
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

/// How many entries of `stream` are pending in group `workers`.
fn pending(server: &RedisServer, stream: &str) -> u64 {
    let out = server.cli(&["XPENDING", stream, "workers"]);
    out.lines()
        .next()
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or(0)
}

/// The consumer holding pending entry `id`.
fn owner(server: &RedisServer, stream: &str, id: &str) -> Option<String> {
    let out = server.cli(&["XPENDING", stream, "workers", id, id, "1"]);
    out.lines().nth(1).map(|l| l.trim().to_owned())
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

/// The dead letter of `job_id` as field/value pairs.
fn dead_letter(server: &RedisServer, job_id: &str) -> Vec<(String, String)> {
    use tower_once::worker::redis;
    let client = redis::Client::open(server.url()).expect("url");
    let mut conn = client.get_connection().expect("connect");
    let entries: Vec<(String, Vec<String>)> = redis::cmd("XRANGE")
        .arg("jobs:dead")
        .arg("-")
        .arg("+")
        .query(&mut conn)
        .expect("XRANGE");
    entries
        .into_iter()
        .map(|(_, flat)| {
            flat.chunks(2)
                .filter_map(|kv| Some((kv.first()?.clone(), kv.get(1)?.clone())))
                .collect::<Vec<_>>()
        })
        .find(|f| f.iter().any(|(k, v)| k == "job_id" && v == job_id))
        .unwrap_or_default()
}

fn field<'a>(letter: &'a [(String, String)], name: &str) -> &'a str {
    letter
        .iter()
        .find(|(k, _)| k == name)
        .map_or("", |(_, v)| v.as_str())
}

/// The worker dies after the effect but before `XACK`: another worker takes the entry over
/// after `claim_idle` as delivery 2. Without run-once the effect happens twice (at least
/// once); with `--run-once` it stays at one.
#[test]
fn killed_between_effect_and_ack_redelivers_and_run_once_keeps_one_effect() {
    for (run_once, effects) in [(false, 2), (true, 1)] {
        let server = RedisServer::start();
        let extra: &[&str] = if run_once { &["--run-once"] } else { &[] };
        let mut a = WorkerProcess::start(&server, &[&["--consumer", "a"], extra].concat());
        xadd(&server, "jobs", "k1", r#"{"action":"ok","linger_ms":3000}"#);
        eventually("the first effect", || counter(&server, "effects:k1") == 1);
        a.kill();
        assert_eq!(
            pending(&server, "jobs"),
            1,
            "not acknowledged before the kill"
        );

        let mut b = WorkerProcess::start(&server, &[&["--consumer", "b"], extra].concat());
        eventually("the takeover", || counter(&server, "deliveries:k1") == 2);
        // Delivery 2 lingers again after a success; the graceful stop waits for it and acks.
        eventually("delivery 2 finished its effect", || {
            counter(&server, "effects:k1") == effects
                && (run_once || counter(&server, "runs:k1") == 2)
        });
        let status = b.terminate();
        assert!(status.success(), "{status:?}");
        assert_eq!(
            counter(&server, "effects:k1"),
            effects,
            "run_once={run_once}"
        );
        assert_eq!(counter(&server, "runs:k1"), effects, "run_once={run_once}");
        assert_eq!(
            pending(&server, "jobs"),
            0,
            "acknowledged by the graceful stop"
        );
        assert_eq!(xlen(&server, "jobs:dead"), 0);
    }
}

/// Poison and permanent failures go to `jobs:dead` with the contract's fields.
#[test]
fn failures_are_redelivered_then_dead_lettered_with_their_fields() {
    let server = RedisServer::start();
    let _w = WorkerProcess::start(&server, &["--max-deliveries", "3"]);
    let fail_id = xadd(&server, "jobs", "poison", r#"{"action":"fail"}"#);
    xadd(&server, "jobs", "perm", r#"{"action":"fail_permanent"}"#);
    xadd(&server, "jobs", "garbage", "{not json");
    xadd(&server, "jobs", "fine", r#"{"action":"ok"}"#);
    eventually("three dead letters", || xlen(&server, "jobs:dead") == 3);
    eventually("nothing pending", || pending(&server, "jobs") == 0);

    assert_eq!(counter(&server, "runs:poison"), 3, "max_deliveries runs");
    assert_eq!(
        counter(&server, "runs:perm"),
        1,
        "a permanent error is not retried"
    );
    assert_eq!(counter(&server, "runs:garbage"), 1);
    assert_eq!(counter(&server, "effects:fine"), 1);
    for id in ["poison", "perm", "garbage"] {
        assert_eq!(counter(&server, &format!("effects:{id}")), 0, "{id}");
    }
    let poison = dead_letter(&server, "poison");
    assert_eq!(field(&poison, "reason"), "max_deliveries");
    assert_eq!(
        field(&poison, "deliveries"),
        "4",
        "the 4th delivery dead-letters"
    );
    assert_eq!(field(&poison, "stream_id"), fail_id);
    assert_eq!(field(&poison, "payload"), r#"{"action":"fail"}"#);
    let perm = dead_letter(&server, "perm");
    assert_eq!(field(&perm, "reason"), "permanent");
    assert_eq!(field(&perm, "deliveries"), "1");
    assert!(field(&perm, "error").contains("permanently"), "{perm:?}");
    assert_eq!(
        field(&dead_letter(&server, "garbage"), "reason"),
        "permanent"
    );
}

/// A job three times `claim_idle` long stays with its live worker; the same job on a worker
/// killed mid-run is taken over (delivery 2) and completes there.
#[test]
fn slow_jobs_stay_with_live_workers_and_leave_dead_ones() {
    let server = RedisServer::start();
    let mut a = WorkerProcess::start(&server, &["--consumer", "a"]);
    let mut b = WorkerProcess::start(&server, &["--consumer", "b"]);
    xadd(&server, "jobs", "slow", r#"{"action":"sleep","ms":1200}"#);
    eventually("the slow job", || counter(&server, "effects:slow") == 1);
    eventually("its ack", || pending(&server, "jobs") == 0);
    assert_eq!(
        counter(&server, "runs:slow"),
        1,
        "not taken over while alive"
    );
    assert_eq!(counter(&server, "deliveries:slow"), 1);

    let id = xadd(&server, "jobs", "orphan", r#"{"action":"sleep","ms":1200}"#);
    eventually("the orphan started", || {
        counter(&server, "runs:orphan") == 1
    });
    let holder = owner(&server, "jobs", &id).expect("pending");
    let (dead, live) = if holder == "a" {
        (&mut a, &b)
    } else {
        (&mut b, &a)
    };
    let _ = live.pid();
    dead.kill();
    eventually("the takeover finished", || {
        counter(&server, "effects:orphan") == 1
    });
    assert_eq!(counter(&server, "runs:orphan"), 2);
    assert_eq!(counter(&server, "deliveries:orphan"), 2);
    eventually("acked", || pending(&server, "jobs") == 0);
}

/// One job id enqueued twice has one effect under `--run-once`; both entries are acknowledged.
#[test]
fn the_same_job_id_enqueued_twice_has_one_effect_with_run_once() {
    let server = RedisServer::start();
    let _w = WorkerProcess::start(&server, &["--run-once", "--concurrency", "1"]);
    xadd(&server, "jobs", "twice", r#"{"action":"ok"}"#);
    xadd(&server, "jobs", "twice", r#"{"action":"ok"}"#);
    xadd(&server, "jobs", "marker", r#"{"action":"ok"}"#);
    eventually("all processed", || {
        counter(&server, "effects:marker") == 1 && pending(&server, "jobs") == 0
    });
    assert_eq!(counter(&server, "effects:twice"), 1);
    assert_eq!(
        counter(&server, "runs:twice"),
        1,
        "the duplicate never ran the handler"
    );
}

/// SIGTERM mid-batch: in-flight jobs finish and are acknowledged, unread ones stay in the
/// stream, the process exits 0; a second worker finishes the rest, each effect once.
#[test]
fn sigterm_finishes_in_flight_jobs_and_exits_zero() {
    let server = RedisServer::start();
    let mut w = WorkerProcess::start(&server, &["--concurrency", "2"]);
    let ids: Vec<String> = (0..6).map(|i| format!("s{i}")).collect();
    for id in &ids {
        xadd(&server, "jobs", id, r#"{"action":"sleep","ms":600}"#);
    }
    eventually("two jobs running", || {
        ids.iter()
            .map(|id| counter(&server, &format!("runs:{id}")))
            .sum::<u64>()
            >= 2
    });
    let status = w.terminate();
    assert!(status.success(), "{status:?}");
    assert_eq!(
        pending(&server, "jobs"),
        0,
        "nothing left half-done in the dead worker's list"
    );
    for id in &ids {
        let (runs, effects) = (
            counter(&server, &format!("runs:{id}")),
            counter(&server, &format!("effects:{id}")),
        );
        assert_eq!(
            runs, effects,
            "{id}: every started job finished (runs {runs}, effects {effects})"
        );
    }
    let _next = WorkerProcess::start(&server, &["--consumer", "next"]);
    eventually("the rest", || {
        ids.iter()
            .all(|id| counter(&server, &format!("effects:{id}")) == 1)
    });
    for id in &ids {
        assert_eq!(counter(&server, &format!("runs:{id}")), 1, "{id}");
    }
}

/// Killed mid-run under `--run-once`: the run-once claim (lease `claim_idle / 2`) has expired
/// by the time the entry is taken over, so delivery 2 runs the job instead of finding it
/// "in progress"; one effect.
#[test]
fn killed_mid_run_with_run_once_runs_again_as_delivery_two() {
    let server = RedisServer::start();
    let mut a = WorkerProcess::start(&server, &["--consumer", "a", "--run-once"]);
    xadd(&server, "jobs", "mid", r#"{"action":"sleep","ms":1500}"#);
    eventually("started", || counter(&server, "runs:mid") == 1);
    a.kill();
    let _b = WorkerProcess::start(&server, &["--consumer", "b", "--run-once"]);
    eventually("done", || counter(&server, "effects:mid") == 1);
    eventually("acked", || pending(&server, "jobs") == 0);
    assert_eq!(counter(&server, "runs:mid"), 2);
    assert_eq!(
        counter(&server, "deliveries:mid"),
        2,
        "taken over once, run at once"
    );
    assert_eq!(counter(&server, "effects:mid"), 1);
}

/// With `--run-once`, "a job id whose effect is done is acknowledged without running again"
/// (examples/README.md, "A Redis Streams worker"): the same job id enqueued twice while its first
/// run (4 s) outlasts `claim_idle * max_deliveries` (400 ms * 2) has one effect, and the duplicate
/// is acknowledged, never put in `jobs:dead`. The worker crate's
/// `run_once::a_duplicate_enqueued_during_a_long_run_is_acked_as_duplicate` checks the library;
/// this one the example's flags. Was broken: the duplicate ended in `jobs:dead`.
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

/// Known limit (worker crate docs, "Known limits"; ignored): a slow but live worker
/// keeps its job, except when Redis is frozen longer than `claim_idle`. Redis frozen (SIGSTOP) for
/// 5x `claim_idle` while a live worker ("a", `--run-once`) runs a long job and a second worker
/// ("b") waits: after SIGCONT the entry's idle time and the run-once claim's TTL (both wall clock)
/// have run out, and whichever `XAUTOCLAIM` Redis executes before the live worker's refresh takes
/// the running job over (delivery 2); the run-once claim has expired, so the handler runs a second
/// time while the first is still running. Intermittent (observed in 1 of 4 single-round runs), so
/// this repeats the scenario for up to 5 rounds.
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

/// SIGTERM while Redis is frozen: the worker still exits 0 (bounded by its command
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

/// SIGTERM mid-batch with concurrency 4 and a shutdown grace shorter than the jobs:
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

/// A worker SIGKILLed mid-job and restarted under the same consumer name, while its old
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
