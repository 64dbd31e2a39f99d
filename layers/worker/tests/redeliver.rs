//! The redelivery delay (worker crate docs, worker crate docs "Semantics": a
//! transient `Err` with `JobError::redeliver_after(d)` is redelivered after about `d`, never
//! earlier, at most `claim_idle`), against real `redis-server` processes. The documented limits (a
//! delay shorter than `block`; consumers of one group with different `claim_idle`) are ignored
//! tests. Every wait is bounded; each test runs in a few seconds.

mod support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::{eventually, first_pending, manager, pending, start, xadd};
use tokio::time::Instant;
use tower::Layer;
use tower_once_idempotency::store::MemoryStore;
use tower_once_test_support::redis::RedisServer;
use tower_once_worker::dead_letter::DeadLetters;
use tower_once_worker::redis::{self, Value};
use tower_once_worker::{Job, JobError, RunOnceLayer, Worker, WorkerConfig};

/// One handler call: the delivery count it saw, when it started and when it returned.
#[derive(Clone, Copy, Debug)]
struct Call {
    deliveries: u64,
    started: Instant,
    ended: Option<Instant>,
}

/// Calls per job id.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<HashMap<String, Vec<Call>>>>);

impl Log {
    fn start(&self, job: &Job) -> usize {
        let mut map = self.0.lock().unwrap();
        let calls = map.entry(job.job_id().to_string()).or_default();
        calls.push(Call {
            deliveries: job.deliveries(),
            started: Instant::now(),
            ended: None,
        });
        calls.len() - 1
    }
    fn end(&self, id: &str, n: usize) {
        self.0.lock().unwrap().get_mut(id).unwrap()[n].ended = Some(Instant::now());
    }
    fn calls(&self, id: &str) -> Vec<Call> {
        self.0.lock().unwrap().get(id).cloned().unwrap_or_default()
    }
    fn count(&self, id: &str) -> usize {
        self.calls(id).len()
    }
    fn deliveries(&self, id: &str) -> Vec<u64> {
        self.calls(id).iter().map(|c| c.deliveries).collect()
    }
    /// From the end of call `n` of `id` to the start of call `n + 1`.
    fn gap(&self, id: &str, n: usize) -> Duration {
        let calls = self.calls(id);
        calls[n + 1].started - calls[n].ended.unwrap()
    }
}

/// A handler that logs each call, sleeps, then returns what `behave(job)` says.
fn handler(
    log: &Log,
    behave: impl Fn(&Job) -> (Duration, Result<(), JobError>) + Clone + Send + Sync + 'static,
) -> impl tower::Service<Job, Response = (), Error = JobError, Future = impl Send> + Clone + Send + 'static
{
    let log = log.clone();
    tower::service_fn(move |job: Job| {
        let n = log.start(&job);
        let id = job.job_id().to_string();
        let (sleep, outcome) = behave(&job);
        let log = log.clone();
        async move {
            tokio::time::sleep(sleep).await;
            log.end(&id, n);
            outcome
        }
    })
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn config(stream: &str, consumer: &str, claim_idle: Duration) -> WorkerConfig {
    WorkerConfig::new(stream, "workers")
        .consumer(consumer)
        .claim_idle(claim_idle)
        .shutdown_grace(Duration::from_secs(3))
}

fn transient(delay: Duration) -> Result<(), JobError> {
    Err(JobError::transient("429 from upstream").redeliver_after(delay))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transient_error_with_a_delay_is_redelivered_after_it_not_after_claim_idle() {
    let server = RedisServer::start();
    let mut conn = manager(&server.url()).await;
    let log = support::Log::default();
    // The upstream says "retry in 300 ms" once; claim_idle is a minute, so without the delay
    // the second delivery would come a minute later, after this test gave up.
    let svc = support::handler(&log, |job| {
        if job.deliveries() == 1 {
            Err(JobError::transient("429 from upstream")
                .redeliver_after(Duration::from_millis(300)))
        } else {
            Ok(Duration::ZERO)
        }
    });
    // Longer than claim_idle: cut to it, so held back exactly as without a delay.
    let long = support::handler(&log, |_| {
        Err(JobError::transient("503").redeliver_after(Duration::from_secs(3600)))
    });
    xadd(&mut conn, "soon", "job-soon", "{}").await;
    xadd(&mut conn, "late", "job-late", "{}").await;
    let minute = Duration::from_secs(60);
    let soon = start!(Worker::connect(
        &server.url(),
        support::config("soon", "w1")
            .claim_idle(minute)
            .block(Duration::from_millis(100)),
        svc
    )
    .unwrap());
    let late = start!(Worker::connect(
        &server.url(),
        support::config("late", "w1")
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

/// Documented limit (worker crate docs): with the default `block` (2 s) a 100 ms delay
/// comes back after about 2 s when the fetcher was already parked in `XREADGROUP ... BLOCK`
/// as the handler asked; it looks at the request when that read returns (later reads are cut
/// short to the next early take-over). Interrupting the read would drop a reply that already
/// delivered entries to this consumer. Set a shorter `block` for delays shorter than it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "documented limit: a delay shorter than `block` waits for the read in progress"]
async fn a_short_delay_waits_out_the_blocking_read() {
    let server = RedisServer::start();
    let mut conn = manager(&server.url()).await;
    let log = Log::default();
    // The first call takes 100 ms, so the fetcher is already blocked in its next read.
    let svc = handler(&log, |job| match job.deliveries() {
        1 => (ms(100), transient(ms(100))),
        _ => (Duration::ZERO, Ok(())),
    });
    xadd(&mut conn, "jobs", "retry-after-100ms", "{}").await;
    // Defaults: claim_idle 30 s, block 2 s.
    let worker = start!(Worker::connect(
        &server.url(),
        WorkerConfig::new("jobs", "workers").consumer("w1"),
        svc
    )
    .unwrap());
    eventually("the second delivery", || async {
        log.count("retry-after-100ms") == 2
    })
    .await;
    let gap = log.gap("retry-after-100ms", 0);
    worker.stop().await;
    assert!(
        gap < ms(600),
        "asked for 100 ms, redelivered after {gap:?} (waited for the 2 s BLOCK to end)"
    );
}

/// Two entries ask at once, A for 1.6 s, then B for 100 ms: each comes back as asked, as the
/// fetcher keeps every requested moment (a bounded heap). Was broken: it kept only the earliest
/// moment, and the early pass for B pushed the regular pass `claim_idle / 2` later, so A came
/// back only at that pass. With `claim_idle` 8 s that pass is past 4 s, far from the 1.6 s asked:
/// the bound (3.2 s) leaves a loaded CI machine 1.6 s of slack (a 2 s `claim_idle` left it 0.4 s,
/// and a run under load came back after 2.6 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_later_delay_behind_an_earlier_one_still_comes_back_within_claim_idle() {
    let server = RedisServer::start();
    let mut conn = manager(&server.url()).await;
    let log = Log::default();
    let svc = handler(&log, |job| {
        match (job.job_id().as_str(), job.deliveries()) {
            ("a", 1) => (Duration::ZERO, transient(ms(1600))),
            ("b", 1) => (ms(150), transient(ms(100))),
            _ => (Duration::ZERO, Ok(())),
        }
    });
    xadd(&mut conn, "jobs", "a", "{}").await;
    xadd(&mut conn, "jobs", "b", "{}").await;
    let claim_idle = Duration::from_secs(8);
    let worker = start!(Worker::connect(
        &server.url(),
        config("jobs", "w1", claim_idle).block(ms(50)),
        svc
    )
    .unwrap());
    eventually("b redelivered", || async { log.count("b") == 2 }).await;
    let b = log.gap("b", 0);
    eventually("a redelivered", || async { log.count("a") == 2 }).await;
    let a = log.gap("a", 0);
    worker.stop().await;
    assert!(b < ms(1000), "b asked for 100 ms, got {b:?}");
    assert!(
        a <= ms(3200),
        "a asked for 1.6 s, redelivered after {a:?} (the regular pass comes {:?} after b's)",
        claim_idle / 2
    );
}

/// Documented limit: two consumers of one group with different `claim_idle` (a rolling deploy
/// changing it):
/// W1 (claim_idle 3 s) is asked to hold an entry back 1.2 s and sets its idle time to 1.8 s;
/// W2 (claim_idle 1.5 s, still longer than W1's refresh interval, so it steals nothing running)
/// sees it as claimable at once and runs it about 0.5 s after the failure: earlier than the
/// 1.2 s asked for and earlier than W2 would have without any delay (1.5 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "documented limit: every consumer of a group must use the same claim_idle"]
async fn a_consumer_with_a_shorter_claim_idle_redelivers_before_the_delay() {
    let server = RedisServer::start();
    let mut conn = manager(&server.url()).await;
    let log = Log::default();
    let first = handler(&log, |job| match job.deliveries() {
        1 => (ms(300), transient(ms(1200))),
        _ => (Duration::ZERO, Ok(())),
    });
    let second = handler(&log, |_| (Duration::ZERO, Ok(())));
    let w1 = start!(Worker::connect(
        &server.url(),
        config("jobs", "w1", Duration::from_secs(3)).block(ms(50)),
        first
    )
    .unwrap());
    // Let W1 create the group and block on it, so it is the one that reads the entry.
    tokio::time::sleep(ms(200)).await;
    xadd(&mut conn, "jobs", "job", "{}").await;
    eventually("w1 has it", || async { log.count("job") == 1 }).await;
    let w2 = start!(Worker::connect(
        &server.url(),
        config("jobs", "w2", ms(1500)).block(ms(50)),
        second
    )
    .unwrap());
    eventually("the second delivery", || async { log.count("job") == 2 }).await;
    let gap = log.gap("job", 0);
    w1.stop().await;
    w2.stop().await;
    assert!(
        gap >= ms(1150),
        "asked for 1.2 s, redelivered (by w2) after {gap:?}"
    );
}

/// `d = 0` on every delivery: redelivered at once each time, but delivery counts still grow
/// (XCLAIM JUSTID does not count) and `max_deliveries` dead-letters it; no busy loop beyond
/// one delivery per read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zero_delay_still_dead_letters_at_max_deliveries() {
    let server = RedisServer::start();
    let mut conn = manager(&server.url()).await;
    let log = Log::default();
    let svc = handler(&log, |_| (Duration::ZERO, transient(Duration::ZERO)));
    xadd(&mut conn, "jobs", "zero", "{}").await;
    let worker = start!(Worker::connect(
        &server.url(),
        config("jobs", "w1", Duration::from_secs(30))
            .block(ms(50))
            .max_deliveries(4),
        svc
    )
    .unwrap());
    let dead = DeadLetters::new(conn.clone(), "jobs");
    eventually("the dead letter", || async {
        dead.count().await.unwrap() == 1
    })
    .await;
    worker.stop().await;
    assert_eq!(log.deliveries("zero"), [1, 2, 3, 4]);
    let letter = &dead.list("-", 10).await.unwrap()[0];
    assert_eq!(
        (letter.reason.as_str(), letter.deliveries),
        ("max_deliveries", 5)
    );
    assert_eq!(pending(&mut conn, "jobs").await, 0);
}

/// `d = Duration::MAX`: cut to `claim_idle` (idle reset to 0), no panic, redelivered after
/// `claim_idle` (plus at most one regular pass), not before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_longest_delay_is_cut_to_claim_idle() {
    let server = RedisServer::start();
    let mut conn = manager(&server.url()).await;
    let log = Log::default();
    let svc = handler(&log, |job| match job.deliveries() {
        1 => (Duration::ZERO, transient(Duration::MAX)),
        _ => (Duration::ZERO, Ok(())),
    });
    xadd(&mut conn, "jobs", "max", "{}").await;
    let claim_idle = Duration::from_secs(1);
    let worker = start!(Worker::connect(
        &server.url(),
        config("jobs", "w1", claim_idle).block(ms(50)),
        svc
    )
    .unwrap());
    eventually("the second delivery", || async { log.count("max") == 2 }).await;
    let report = worker.stop().await;
    let gap = log.gap("max", 0);
    assert!(gap >= claim_idle, "redelivered early: {gap:?}");
    assert!(gap < claim_idle * 2, "redelivered late: {gap:?}");
    assert_eq!(log.deliveries("max"), [1, 2]);
    assert_eq!((report.acked, report.left_pending), (1, 1));
}

/// The entry was taken over by another consumer while its handler ran here: the delay script
/// leaves it alone (owner and idle time unchanged) and this worker does not run it early.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_consumers_entry_is_not_touched() {
    let server = RedisServer::start();
    let mut conn = manager(&server.url()).await;
    let log = Log::default();
    let thief = conn.clone();
    let svc = tower::service_fn(move |job: Job| {
        let n = log.start(&job);
        let mut thief = thief.clone();
        let log = log.clone();
        async move {
            let _: Value = redis::cmd("XCLAIM")
                .arg("jobs")
                .arg("workers")
                .arg("thief")
                .arg(0)
                .arg(job.stream_id())
                .arg("JUSTID")
                .query_async(&mut thief)
                .await
                .unwrap();
            log.end(job.job_id().as_str(), n);
            transient(Duration::ZERO)
        }
    });
    xadd(&mut conn, "jobs", "stolen", "{}").await;
    let claim_idle = Duration::from_secs(3);
    let worker = start!(Worker::connect(
        &server.url(),
        config("jobs", "w1", claim_idle).block(ms(50)),
        svc
    )
    .unwrap());
    let c = conn.clone();
    eventually("pending at the thief", || {
        let mut c = c.clone();
        async move { pending(&mut c, "jobs").await == 1 }
    })
    .await;
    tokio::time::sleep(ms(1000)).await;
    let (owner, idle) = first_pending(&mut conn, "jobs").await;
    worker.stop().await;
    assert_eq!(owner, "thief");
    assert!((900..3000).contains(&idle), "idle {idle} ms");
}

/// Run-once: the failed delivery releases its claim before the delay is set, so the early
/// redelivery runs the handler (not "in progress") and its delay is found through
/// `RunOnceError`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_once_early_redelivery_runs_the_handler() {
    let server = RedisServer::start();
    let mut conn = manager(&server.url()).await;
    let log = Log::default();
    let inner = handler(&log, |job| match job.deliveries() {
        1 => (ms(50), transient(ms(200))),
        _ => (Duration::ZERO, Ok(())),
    });
    let svc = RunOnceLayer::new(MemoryStore::new()).layer(inner);
    xadd(&mut conn, "jobs", "once", "{}").await;
    let worker = start!(Worker::connect(
        &server.url(),
        config("jobs", "w1", Duration::from_secs(30)).block(ms(50)),
        svc
    )
    .unwrap());
    eventually("acked", || async {
        log.count("once") == 2 && pending(&mut conn.clone(), "jobs").await == 0
    })
    .await;
    let report = worker.stop().await;
    let gap = log.gap("once", 0);
    assert!(gap >= ms(200) && gap < ms(600), "{gap:?}");
    assert_eq!(log.deliveries("once"), [1, 2]);
    assert_eq!(report.acked, 1);
}

/// The worker stops right after holding an entry back: the delay is in Redis, so the next
/// worker (same claim_idle) takes it over no earlier than asked and before claim_idle.
/// (claim_idle is 5 s: the next worker's takeover pass comes every claim_idle / 2, and a
/// loaded machine delays its start by a second or more; 3 s left too little room.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_shutdown_the_next_worker_respects_the_delay() {
    let server = RedisServer::start();
    let mut conn = manager(&server.url()).await;
    let log = Log::default();
    let svc = handler(&log, |job| match job.deliveries() {
        1 => (Duration::ZERO, transient(ms(700))),
        _ => (Duration::ZERO, Ok(())),
    });
    xadd(&mut conn, "jobs", "handover", "{}").await;
    let claim_idle = Duration::from_secs(5);
    let cfg = |name| config("jobs", name, claim_idle).block(ms(50));
    let w1 = start!(Worker::connect(&server.url(), cfg("w1"), svc.clone()).unwrap());
    eventually("the failure", || async {
        log.calls("handover")
            .first()
            .is_some_and(|c| c.ended.is_some())
    })
    .await;
    let report = w1.stop().await;
    assert_eq!(report.left_pending, 1);
    let w2 = start!(Worker::connect(&server.url(), cfg("w2"), svc).unwrap());
    eventually("the second delivery", || async {
        log.count("handover") == 2
    })
    .await;
    w2.stop().await;
    let gap = log.gap("handover", 0);
    assert!(gap >= ms(700) && gap < claim_idle, "{gap:?}");
    assert_eq!(log.deliveries("handover"), [1, 2]);
}
