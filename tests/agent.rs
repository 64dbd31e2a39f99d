//! The agent example (crate docs of tower-once-step, examples/README.md) as real processes against
//! a fake payments API on loopback and a `redis-server` of the test's own as `STATE`: three tool
//! calls per run, each a durable step; `lookup` retried on a timeout; `refund` retried with one
//! `Idempotency-Key` derived from (run, step, tool), the same in another process; `note` never
//! sent twice, and `unknown` when its call timed out or a killed process left it in progress; a
//! process started again replays what is recorded, a changed `--amount` is a `mismatch` that sends
//! nothing, two processes on one `STATE` call each step once, a Redis restart refunds nothing
//! twice, and the db number of `STATE` separates namespaces. Every test counts what the API
//! received and applied (requests per tool and run, refunds applied, notes created) and checks the
//! example's outcome lines and summary against them. Every wait is bounded; nothing asserts on
//! timing.
#![cfg(feature = "redis")]

mod support;

use serde_json::Value;
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};
use support::payments::{Behaviour, Delay, Payments};
use tower_once_test_support::ports::free_port;
use tower_once_test_support::redis::RedisServer;

const LIMIT: Duration = Duration::from_secs(60);
/// Timeouts that a loaded machine does not reach on loopback, for the tests about something else.
const CALM: [&str; 4] = ["--timeout-ms", "5000", "--deadline-ms", "20000"];
const OUTCOMES: [&str; 5] = ["called", "replayed", "unknown", "mismatch", "failed"];
const TOOLS: [&str; 3] = ["lookup", "refund", "note"];

/// The example's binary; a clear failure when the example is not there.
fn binary() -> PathBuf {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    assert!(
        examples.join("agent.rs").exists() || examples.join("agent/main.rs").exists(),
        "examples/agent.rs is missing: these tests run the agent example as a process"
    );
    support::example_binary_with("agent", "redis")
}

fn runs(n: usize) -> Vec<String> {
    (0..n).map(|r| format!("run-{r}")).collect()
}

/// `STATE` in database `db` of `redis`.
fn state(redis: &RedisServer, db: u32) -> String {
    format!("{}/{db}", redis.url())
}

fn dbsize(redis: &RedisServer, db: u32) -> u64 {
    let out = redis.cli(&["-n", &db.to_string(), "DBSIZE"]);
    out.trim()
        .parse()
        .unwrap_or_else(|_| panic!("DBSIZE: {out}"))
}

/// One outcome line of stdout.
#[derive(Debug)]
struct Step {
    run: String,
    step: u64,
    outcome: String,
    attempts: u64,
}

impl Step {
    fn parse(line: &Value) -> Self {
        let text = |f: &str| {
            line[f]
                .as_str()
                .unwrap_or_else(|| panic!("no {f}: {line}"))
                .to_owned()
        };
        let number = |f: &str| line[f].as_u64().unwrap_or_else(|| panic!("no {f}: {line}"));
        let step = Step {
            run: text("run"),
            step: number("step"),
            outcome: text("outcome"),
            attempts: number("attempts"),
        };
        assert!((1..=3).contains(&step.step), "{line}");
        assert_eq!(text("tool"), TOOLS[step.step as usize - 1], "{line}");
        assert!(OUTCOMES.contains(&step.outcome.as_str()), "{line}");
        step
    }
}

/// What a process printed, and how it ended (`None`: killed).
struct Out {
    status: Option<ExitStatus>,
    steps: Vec<Step>,
    summary: Option<Value>,
    stderr: String,
}

impl Out {
    fn line(&self, run: &str, step: u64) -> &Step {
        self.steps
            .iter()
            .find(|s| s.run == run && s.step == step)
            .unwrap_or_else(|| panic!("no line for {run} step {step}: {self}"))
    }

    fn outcome(&self, run: &str, step: u64) -> Option<&str> {
        let line = self.steps.iter().find(|s| s.run == run && s.step == step);
        line.map(|s| s.outcome.as_str())
    }

    fn count(&self, outcome: &str) -> usize {
        self.steps.iter().filter(|s| s.outcome == outcome).count()
    }

    fn summary(&self, field: &str) -> u64 {
        let summary = self
            .summary
            .as_ref()
            .unwrap_or_else(|| panic!("no summary: {self}"));
        summary[field]
            .as_u64()
            .unwrap_or_else(|| panic!("no summary.{field}: {self}"))
    }

    fn ok(&self) -> bool {
        self.status.is_some_and(|s| s.success())
    }

    /// The rules every finished process keeps: no panic; one summary whose counts are the
    /// lines'; exit 0 exactly when no step failed; one line per step, a run's steps in order.
    fn checked(self) -> Self {
        assert!(!self.stderr.contains("panicked"), "{self}");
        assert_eq!(self.summary("steps"), self.steps.len() as u64, "{self}");
        for outcome in OUTCOMES {
            assert_eq!(
                self.summary(outcome),
                self.count(outcome) as u64,
                "{outcome}: {self}"
            );
        }
        assert_eq!(
            self.ok(),
            self.summary("failed") == 0,
            "exit status: {self}"
        );
        let mut next = std::collections::HashMap::new();
        for s in &self.steps {
            let expected = next.entry(s.run.as_str()).or_insert(1);
            assert_eq!(
                s.step, *expected,
                "{}: steps in order, once each: {self}",
                s.run
            );
            *expected += 1;
        }
        self
    }
}

impl std::fmt::Display for Out {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "exit {:?}", self.status)?;
        for s in &self.steps {
            writeln!(
                f,
                "{} step {} {} ({} attempts)",
                s.run, s.step, s.outcome, s.attempts
            )?;
        }
        let summary = self.summary.as_ref().map(Value::to_string);
        writeln!(f, "summary {}", summary.unwrap_or_default())?;
        write!(f, "stderr:\n{}", self.stderr)
    }
}

/// The example as a process, its stdout and stderr in files (no pipe to fill), killed on drop.
struct Agent {
    child: Option<Child>,
    stdout: PathBuf,
    stderr: PathBuf,
}

impl Agent {
    fn start(api: &Payments, state: &str, runs: usize, extra: &[&str]) -> Self {
        let file = |ext: &str| {
            std::env::temp_dir().join(format!(
                "tower-once-agent-{}-{}.{ext}",
                std::process::id(),
                fastrand::u64(..)
            ))
        };
        let (stdout, stderr) = (file("out"), file("err"));
        let child = Command::new(binary())
            .args(["--payments", api.url(), "--state", state])
            .args(["--runs", &runs.to_string()])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&stdout).expect("stdout file"))
            .stderr(std::fs::File::create(&stderr).expect("stderr file"))
            .spawn()
            .expect("start the agent example");
        Self {
            child: Some(child),
            stdout,
            stderr,
        }
    }

    /// Polls `check` (bounded) while the process runs; fails with its output if it exits first.
    fn wait_until(&mut self, what: &str, mut check: impl FnMut() -> bool) {
        let started = Instant::now();
        while !check() {
            let child = self.child.as_mut().expect("running");
            if let Some(status) = child.try_wait().expect("try_wait") {
                self.child = None;
                panic!("exited before {what}: {}", self.output(Some(status), true));
            }
            assert!(started.elapsed() < LIMIT, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits for the exit (bounded by `limit`); on overrun kills it and fails with its output.
    fn wait(mut self, limit: Duration) -> Out {
        let mut child = self.child.take().expect("running");
        let started = Instant::now();
        let status = loop {
            if let Some(status) = child.try_wait().expect("try_wait") {
                break status;
            }
            if started.elapsed() > limit {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "still running after {limit:?}: {}",
                    self.output(None, false)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        self.output(Some(status), true)
    }

    /// SIGKILL (what `Child::kill` sends on unix): no chance to record or release anything.
    fn kill(mut self) -> Out {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.output(None, false)
    }

    /// Every stdout line is JSON (but the last of a killed process, which may be cut).
    fn output(&self, status: Option<ExitStatus>, exited: bool) -> Out {
        let stdout = std::fs::read_to_string(&self.stdout).unwrap_or_default();
        let stderr = std::fs::read_to_string(&self.stderr).unwrap_or_default();
        let lines: Vec<&str> = stdout.lines().filter(|l| !l.trim().is_empty()).collect();
        let (mut steps, mut summary) = (Vec::new(), None);
        for (i, line) in lines.iter().enumerate() {
            let value: Value = match serde_json::from_str(line) {
                Ok(value) => value,
                Err(_) if !exited && i + 1 == lines.len() => break,
                Err(e) => panic!("stdout line {line:?} is not JSON ({e}); stderr:\n{stderr}"),
            };
            if summary.is_some() {
                panic!("a line after the summary: {line}; stderr:\n{stderr}");
            }
            match value.get("summary") {
                Some(s) => summary = Some(s.clone()),
                None => steps.push(Step::parse(&value)),
            }
        }
        Out {
            status,
            steps,
            summary,
            stderr,
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_file(&self.stdout);
        let _ = std::fs::remove_file(&self.stderr);
    }
}

/// One process to its end (bounded), checked.
fn run(api: &Payments, state: &str, runs: usize, extra: &[&str]) -> Out {
    Agent::start(api, state, runs, extra).wait(LIMIT).checked()
}

/// Runs with one refund of `amount` applied and one note each.
fn assert_one_refund_and_one_note(api: &Payments, runs: &[String], amount: u64) {
    for run in runs {
        let log = api.run(run);
        assert_eq!(log.refunds, [amount], "{run}: refunds applied: {log:?}");
        assert_eq!(log.notes, ["refunded"], "{run}: notes created: {log:?}");
    }
    assert!(api.unexpected().is_empty(), "{:?}", api.unexpected());
}

#[test]
fn every_step_is_called_once_and_a_second_process_replays_all_without_a_request() {
    let redis = RedisServer::start();
    let api = Payments::start(Behaviour::default());
    let state = state(&redis, 0);
    let first = run(&api, &state, 6, &CALM);
    assert!(first.ok(), "{first}");
    assert_eq!(first.steps.len(), 18, "{first}");
    assert_eq!(first.count("called"), 18, "{first}");
    assert_one_refund_and_one_note(&api, &runs(6), 40);
    let mut keys = HashSet::new();
    for run in runs(6) {
        let log = api.run(&run);
        assert_eq!(log.lookups, 1, "{run}");
        assert_eq!(log.refund_requests, 1, "{run}");
        let key = log.refund_keys[0].clone();
        assert!(key.is_some(), "{run}: a refund carries an Idempotency-Key");
        keys.insert(key);
        for step in 1..=3 {
            assert_eq!(first.line(&run, step).attempts, 1, "{first}");
        }
    }
    assert_eq!(keys.len(), 6, "one key per run: {keys:?}");
    assert_eq!(api.requests(), 18);

    let again = run(&api, &state, 6, &CALM);
    assert!(again.ok(), "{again}");
    assert_eq!(again.steps.len(), 18, "{again}");
    assert_eq!(again.count("replayed"), 18, "{again}");
    assert_eq!(api.requests(), 18, "a replay sends nothing");
}

/// The first request of every lookup and every refund takes 2.5 s, over the 1 s timeout; the
/// refund is applied all the same, and its key answers `409` until then, its refund after.
#[test]
fn slow_first_arrivals_are_retried_and_each_refund_keeps_one_key_in_every_process() {
    let redis = RedisServer::start();
    let slow = Delay::Sleep(Duration::from_millis(2500));
    let api = Payments::start(Behaviour {
        lookup_first: slow,
        refund_first: slow,
        ..Behaviour::default()
    });
    let args = ["--timeout-ms", "1000", "--deadline-ms", "20000"];
    let out = run(&api, &state(&redis, 0), 3, &args);
    assert!(out.ok(), "{out}");
    assert_eq!(out.count("called"), 9, "{out}");
    assert_one_refund_and_one_note(&api, &runs(3), 40);
    let mut first_keys = Vec::new();
    for run in runs(3) {
        let log = api.run(&run);
        let lookup = out.line(&run, 1);
        assert!(lookup.attempts >= 2, "the first lookup timed out: {out}");
        assert_eq!(
            lookup.attempts, log.lookups,
            "{run}: one request per attempt"
        );
        let refund = out.line(&run, 2);
        assert!(refund.attempts >= 2, "the first refund timed out: {out}");
        assert_eq!(refund.attempts, log.refund_requests, "{run}: {log:?}");
        let key = log.refund_keys[0].clone();
        assert!(key.is_some(), "{run}: {log:?}");
        assert!(
            log.refund_keys.iter().all(|k| *k == key),
            "{run}: every attempt carries the first attempt's key: {log:?}"
        );
        first_keys.push(key);
    }
    assert_eq!(first_keys.iter().collect::<HashSet<_>>().len(), 3);

    // A process with a STATE of its own (another Redis) has nothing recorded and calls every
    // step again: its refunds carry the same keys (derived from run, step and tool, not stored),
    // so the API answers them with the refunds it applied.
    let other = RedisServer::start();
    let sent: Vec<usize> = runs(3)
        .iter()
        .map(|r| api.run(r).refund_keys.len())
        .collect();
    let again = run(&api, &state(&other, 0), 3, &CALM);
    assert!(again.ok(), "{again}");
    for (i, run) in runs(3).iter().enumerate() {
        assert_eq!(again.outcome(run, 2), Some("called"), "{again}");
        let log = api.run(run);
        let later = &log.refund_keys[sent[i]..];
        assert!(!later.is_empty(), "{run}: {log:?}");
        assert!(later.iter().all(|k| *k == first_keys[i]), "{run}: {log:?}");
        assert_eq!(log.refunds, [40], "{run}: the API replayed its refund");
    }
}

/// run-1's note hangs past the 2 s timeout; the note is created on arrival all the same.
#[test]
fn a_note_whose_call_timed_out_is_unknown_sent_once_and_stays_unknown() {
    let redis = RedisServer::start();
    let api = Payments::start(Behaviour {
        note_first: Delay::Hang,
        only_runs: vec!["run-1".into()],
        ..Behaviour::default()
    });
    let state = state(&redis, 0);
    let args = ["--timeout-ms", "2000", "--deadline-ms", "20000"];
    let out = run(&api, &state, 3, &args);
    api.release();
    assert_eq!(out.outcome("run-1", 3), Some("unknown"), "{out}");
    assert_eq!(out.line("run-1", 3).attempts, 1, "never sent twice: {out}");
    for run in ["run-0", "run-2"] {
        assert_eq!(out.outcome(run, 3), Some("called"), "{out}");
    }
    assert_eq!(out.summary("unknown"), 1, "{out}");
    assert_eq!(out.summary("failed"), 0, "{out}");
    assert_one_refund_and_one_note(&api, &runs(3), 40);

    let requests = api.requests();
    let again = run(&api, &state, 3, &args);
    assert_eq!(
        again.outcome("run-1", 3),
        Some("unknown"),
        "recorded so: {again}"
    );
    assert_eq!(again.count("replayed"), 8, "{again}");
    assert_eq!(api.requests(), requests, "nothing sent again");
    assert_eq!(api.run("run-1").notes.len(), 1);
}

/// Two runs at a time, every note hanging: the process is killed with both notes in flight.
/// Started again, it replays their lookups and refunds, settles their notes as `unknown` within
/// seconds (not the 15 s deadline) and calls the two runs it had not begun.
#[test]
fn a_killed_process_resumes_replaying_done_steps_and_settles_notes_in_flight_as_unknown() {
    let redis = RedisServer::start();
    let api = Payments::start(Behaviour {
        note_first: Delay::Hang,
        ..Behaviour::default()
    });
    let state = state(&redis, 0);
    let args = [
        "--concurrency",
        "2",
        "--timeout-ms",
        "10000",
        "--deadline-ms",
        "15000",
    ];
    let mut first = Agent::start(&api, &state, 4, &args);
    first.wait_until("two notes in flight", || api.notes() >= 2);
    let killed = first.kill();
    let in_flight: Vec<String> = runs(4)
        .into_iter()
        .filter(|r| !api.run(r).notes.is_empty())
        .collect();
    assert_eq!(in_flight.len(), 2, "two runs at a time: {killed}");
    assert!(
        killed.steps.iter().all(|s| s.step < 3),
        "no note was answered: {killed}"
    );
    let before: Vec<_> = in_flight.iter().map(|r| api.run(r)).collect();
    api.set(Behaviour::default());
    api.release();

    let again = Agent::start(&api, &state, 4, &args)
        .wait(Duration::from_secs(20))
        .checked();
    assert!(again.ok(), "{again}");
    for (run, before) in in_flight.iter().zip(&before) {
        assert_eq!(again.outcome(run, 1), Some("replayed"), "{again}");
        assert_eq!(again.outcome(run, 2), Some("replayed"), "{again}");
        assert_eq!(again.outcome(run, 3), Some("unknown"), "{again}");
        let log = api.run(run);
        assert_eq!(log.lookups, before.lookups, "{run}: no second lookup");
        assert_eq!(log.refund_requests, before.refund_requests, "{run}");
    }
    for run in runs(4).iter().filter(|r| !in_flight.contains(r)) {
        for step in 1..=3 {
            assert_eq!(again.outcome(run, step), Some("called"), "{again}");
        }
    }
    assert_one_refund_and_one_note(&api, &runs(4), 40);
}

#[test]
fn another_amount_on_the_same_state_is_a_mismatch_and_sends_nothing() {
    let redis = RedisServer::start();
    let api = Payments::start(Behaviour::default());
    let state = state(&redis, 0);
    let first = run(&api, &state, 3, &CALM);
    assert!(first.ok(), "{first}");
    assert_eq!(first.count("called"), 9, "{first}");
    let requests = api.requests();

    let other = run(&api, &state, 3, &[&CALM[..], &["--amount", "55"]].concat());
    for run in runs(3) {
        assert_eq!(other.outcome(&run, 1), Some("replayed"), "{other}");
        assert_eq!(other.outcome(&run, 2), Some("mismatch"), "{other}");
    }
    assert_eq!(other.summary("mismatch"), 3, "{other}");
    assert_eq!(api.requests(), requests, "a mismatch sends nothing");
    assert_one_refund_and_one_note(&api, &runs(3), 40);

    // The mismatch left the recorded steps as they were.
    let same = run(&api, &state, 3, &CALM);
    assert_eq!(same.count("replayed"), 9, "{same}");
    assert_eq!(api.requests(), requests);
}

/// Notes take 500 ms, so that the two processes overlap.
#[test]
fn two_processes_on_one_state_call_each_step_once() {
    let redis = RedisServer::start();
    let api = Payments::start(Behaviour {
        note_first: Delay::Sleep(Duration::from_millis(500)),
        ..Behaviour::default()
    });
    let state = state(&redis, 0);
    let a = Agent::start(&api, &state, 8, &CALM);
    let b = Agent::start(&api, &state, 8, &CALM);
    let (a, b) = (a.wait(LIMIT).checked(), b.wait(LIMIT).checked());
    assert!(a.ok() && b.ok(), "{a}\n{b}");
    for run in runs(8) {
        for step in 1..=3 {
            let outcomes = [a.outcome(&run, step), b.outcome(&run, step)];
            assert!(
                outcomes.contains(&Some("called")) && outcomes.contains(&Some("replayed")),
                "{run} step {step}: called by one, its result used by the other: {a}\n{b}"
            );
        }
        let log = api.run(&run);
        assert_eq!(log.lookups, 1, "{run}");
        assert_eq!(log.refund_requests, 1, "{run}");
    }
    assert_one_refund_and_one_note(&api, &runs(8), 40);
}

/// Redis (append-only, fsync always: what it acknowledged survives) is killed while notes are
/// in flight and started again a second later. The process finishes or fails, bounded and without
/// a panic; a process started again completes every run; no run is refunded or noted twice.
#[test]
fn a_redis_restart_mid_run_never_refunds_or_notes_twice() {
    let aof = ["--appendonly", "yes", "--appendfsync", "always"];
    let mut redis = RedisServer::start_with(free_port(), &aof);
    let api = Payments::start(Behaviour {
        note_first: Delay::Sleep(Duration::from_millis(1500)),
        ..Behaviour::default()
    });
    let state = state(&redis, 0);
    let args = [&["--concurrency", "2"][..], &CALM[..]].concat();
    let mut first = Agent::start(&api, &state, 6, &args);
    first.wait_until("a note in flight", || api.notes() >= 1);
    redis.stop();
    std::thread::sleep(Duration::from_secs(1));
    redis.restart();
    let first = first.wait(LIMIT);
    assert!(!first.stderr.contains("panicked"), "{first}");
    for run in runs(6) {
        let log = api.run(&run);
        assert!(
            log.refunds.len() <= 1 && log.notes.len() <= 1,
            "{run}: {log:?}"
        );
    }

    // One outage of a second within a 20 s deadline is no reason for a step to fail for good.
    let again = run(&api, &state, 6, &args);
    assert!(again.ok(), "{again}\nfirst process: {first}");
    for run in runs(6) {
        let log = api.run(&run);
        assert_eq!(log.refunds, [40], "{run}: {log:?}");
        match again.outcome(&run, 3) {
            Some("called" | "replayed") => assert_eq!(log.notes.len(), 1, "{run}"),
            Some("unknown") => assert!(log.notes.len() <= 1, "{run}: {log:?}"),
            other => panic!("{run}: note {other:?}: {again}"),
        }
    }
    assert!(api.unexpected().is_empty(), "{:?}", api.unexpected());
}

#[test]
fn the_db_number_separates_namespaces_and_the_refund_key_does_not_depend_on_it() {
    let redis = RedisServer::start();
    let api = Payments::start(Behaviour::default());
    let first = run(&api, &state(&redis, 0), 3, &CALM);
    assert!(first.ok(), "{first}");
    assert_eq!(first.count("called"), 9, "{first}");
    assert!(dbsize(&redis, 0) > 0, "the steps are kept in db 0");
    assert_eq!(dbsize(&redis, 1), 0, "and nothing in db 1");
    let keys: Vec<_> = runs(3).iter().map(|r| api.run(r).refund_keys).collect();

    let second = run(&api, &state(&redis, 1), 3, &CALM);
    assert!(second.ok(), "{second}");
    assert_eq!(
        second.count("called"),
        9,
        "db 1 holds none of db 0's steps: {second}"
    );
    assert!(dbsize(&redis, 1) > 0, "the steps are kept in db 1");
    for (run, keys) in runs(3).iter().zip(&keys) {
        let log = api.run(run);
        assert_eq!(log.refund_keys.len(), 2, "{run}: {log:?}");
        assert_eq!(log.refund_keys[1], keys[0], "{run}: the same key");
        assert_eq!(log.refunds, [40], "{run}: the API replayed its refund");
        assert_eq!(log.notes.len(), 2, "{run}: a fresh namespace knows no note");
    }

    let requests = api.requests();
    let third = run(&api, &state(&redis, 0), 3, &CALM);
    assert_eq!(third.count("replayed"), 9, "db 0 kept its steps: {third}");
    assert_eq!(api.requests(), requests);
}
