//! An outage of the handler's dependency (worker crate docs "Semantics": the worker fetches
//! only as many entries as its handler is ready to run; the breaker crate's "Readiness"): with a
//! circuit breaker that gates readiness, the worker stops fetching while the circuit is open,
//! so a 10 s outage (five times the job deadline) with `max_deliveries` 3 dead-letters nothing
//! and every job runs once it ends, with nobody's help; without it, the same outage
//! dead-letters them. Real
//! `redis-server`, real time (Redis's idle times), bounded waits; handler calls are counted.

mod support;

use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;
use support::{config, dead_letters, eventually, handler, manager, pending, start, xadd, Log};
use tower::Layer;
use tower_once_breaker::CircuitBreakerLayer;
use tower_once_retry::backoff::{Backoff, Jitter};
use tower_once_test_support::redis::RedisServer;
use tower_once_worker::{JobError, Worker};

const JOBS: usize = 5;
const OUTAGE: Duration = Duration::from_secs(10);

/// A handler whose dependency is down until `down` is cleared.
fn handler_with_outage(
    log: &Log,
    down: &Arc<AtomicBool>,
) -> impl tower::Service<tower_once_worker::Job, Response = (), Error = JobError, Future = impl Send>
       + Clone
       + Send
       + 'static {
    let down = down.clone();
    handler(log, move |_| match down.load(SeqCst) {
        true => Err(JobError::transient("dependency down")),
        false => Ok(Duration::ZERO),
    })
}

fn end_outage_after(down: &Arc<AtomicBool>, after: Duration) {
    let down = down.clone();
    tokio::spawn(async move {
        tokio::time::sleep(after).await;
        down.store(false, SeqCst);
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gated_breaker_rides_out_an_outage_without_a_dead_letter() {
    let server = RedisServer::start();
    let mut conn = manager(&server.url()).await;
    let log = Log::default();
    let down = Arc::new(AtomicBool::new(true));
    for i in 0..JOBS {
        xadd(&mut conn, "jobs", &format!("job-{i}"), "{}").await;
    }
    // Breaks of 1-2 s, 2-4 s, 4-8 s: probes end by 14 s whatever the jitter.
    let breaks = Backoff::new(Duration::from_secs(2), 2.0, Duration::from_secs(8)).unwrap();
    let breaker = CircuitBreakerLayer::new()
        .consecutive_failures(3)
        .break_duration(breaks.jitter(Jitter::Equal))
        .gate_readiness(true);
    let circuit = breaker.circuits().circuit("");
    let svc = breaker.layer(handler_with_outage(&log, &down));
    end_outage_after(&down, OUTAGE);
    // A job deadline shorter than the outage: a job fetched while the circuit is open and
    // left waiting for it would miss its deadline and count a delivery.
    let cfg = config("jobs", "w1")
        .max_deliveries(3)
        .job_deadline(Duration::from_secs(2));
    let worker = start!(Worker::connect(&server.url(), cfg, svc).unwrap());
    eventually("every job acknowledged", || {
        let mut c = conn.clone();
        let done = (0..JOBS)
            .all(|i| !log.deliveries(&format!("job-{i}")).is_empty() && !down.load(SeqCst));
        async move { done && pending(&mut c, "jobs").await == 0 }
    })
    .await;
    let report = worker.stop().await;
    assert!(dead_letters(&mut conn, "jobs").await.is_empty());
    assert_eq!(report.dead_lettered, 0);
    assert_eq!(report.acked, JOBS as u64);
    for i in 0..JOBS {
        let deliveries = log.deliveries(&format!("job-{i}"));
        assert!(
            deliveries.iter().all(|d| *d <= 3),
            "job-{i}: {deliveries:?}"
        );
    }
    // The first deliveries, then at most one probe per break: the worker fetched nothing
    // while the circuit was open (without it, each job would have been delivered every
    // claim_idle, 300 ms, until dead-lettered).
    let during_outage = log.total() - JOBS;
    assert!(
        during_outage <= JOBS + 3,
        "{} handler calls in all",
        log.total()
    );
    assert_eq!(circuit.state(), tower_once_breaker::CircuitState::Closed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn for_comparison_without_the_breaker_the_same_outage_dead_letters_them() {
    let server = RedisServer::start();
    let mut conn = manager(&server.url()).await;
    let log = Log::default();
    let down = Arc::new(AtomicBool::new(true));
    for i in 0..JOBS {
        xadd(&mut conn, "jobs", &format!("job-{i}"), "{}").await;
    }
    end_outage_after(&down, OUTAGE);
    let svc = handler_with_outage(&log, &down);
    let worker =
        start!(
            Worker::connect(&server.url(), config("jobs", "w1").max_deliveries(3), svc).unwrap()
        );
    eventually("every job dead-lettered", || {
        let mut c = conn.clone();
        async move { dead_letters(&mut c, "jobs").await.len() == JOBS }
    })
    .await;
    worker.stop().await;
    assert!(down.load(SeqCst), "within the outage");
    assert_eq!(log.total(), JOBS * 3);
}

fn fixed_break(secs: u64) -> Backoff {
    Backoff::new(Duration::from_secs(secs), 1.0, Duration::from_secs(secs))
        .unwrap()
        .jitter(Jitter::None)
}

/// Whether `job_id` was dead-lettered.
async fn dead_lettered(
    conn: &mut tower_once_worker::redis::aio::ConnectionManager,
    job_id: &str,
) -> bool {
    dead_letters(conn, "jobs")
        .await
        .iter()
        .any(|d| d.get("job_id").map(String::as_str) == Some(job_id))
}

/// "No entry is fetched that its handler is not ready to run; a gated breaker's outage costs
/// no delivery." The worker readies its handler (the circuit closed), then blocks in
/// `XREADGROUP` waiting for entries; meanwhile a running job fails and opens the circuit
/// (one failure, a 3 s break, longer than the 1 s job deadline). An entry added then is
/// fetched for the service readied before the outage: its admission is stale, the call is
/// refused, and the delivery is spent without the handler running. With `max_deliveries` 1,
/// the job is dead-lettered when the circuit admits again, though the handler never saw it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_circuit_that_opens_while_the_worker_waits_for_entries_costs_no_delivery() {
    let server = RedisServer::start();
    let mut conn = manager(&server.url()).await;
    let log = Log::default();
    let breaker = CircuitBreakerLayer::new()
        .consecutive_failures(1)
        .break_duration(fixed_break(3))
        .gate_readiness(true);
    let circuit = breaker.circuits().circuit("");
    let svc = breaker.layer(poisoned_handler(&log));
    xadd(&mut conn, "jobs", "poison", "{}").await;
    let cfg = config("jobs", "w1")
        .max_deliveries(1)
        .job_deadline(Duration::from_secs(1))
        .block(Duration::from_secs(5));
    let worker = start!(Worker::connect(&server.url(), cfg, svc).unwrap());
    eventually("the circuit open", || {
        let open = circuit.state() == tower_once_breaker::CircuitState::Open;
        async move { open }
    })
    .await;
    // The worker is in XREADGROUP with a service readied while the circuit was closed.
    xadd(&mut conn, "jobs", "job-1", "{}").await;
    eventually("job-1 acknowledged or dead-lettered", || {
        let mut c = conn.clone();
        let ran = log.calls("job-1") > 0;
        async move {
            (ran && pending(&mut c, "jobs").await == 0) || dead_lettered(&mut c, "job-1").await
        }
    })
    .await;
    let _ = worker.stop().await;
    assert!(
        !dead_lettered(&mut conn, "job-1").await,
        "job-1 dead-lettered, never run: its one delivery went to a call the open circuit refused"
    );
    assert_eq!(
        log.deliveries("job-1"),
        [1],
        "a delivery spent during the outage"
    );
}

/// A handler on which job "poison" finds the dependency down after 300 ms (a circuit with one
/// failure allowed opens); the others succeed at once.
fn poisoned_handler(
    log: &Log,
) -> impl tower::Service<tower_once_worker::Job, Response = (), Error = JobError, Future = impl Send>
       + Clone
       + Send
       + 'static {
    let seen = log.clone();
    tower::service_fn(move |job: tower_once_worker::Job| {
        seen.record(&job);
        let poison = job.job_id().as_str() == "poison";
        async move {
            if poison {
                tokio::time::sleep(Duration::from_millis(300)).await;
                return Err(JobError::transient("dependency down"));
            }
            Ok(())
        }
    })
}

/// A gated worker waits for its circuit; the operator closes it by hand (the dependency is
/// back, or the trip was spurious). The worker must resume at once, not when the 60 s break
/// would have ended: the job added during the wait runs within a second or two.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_the_circuit_by_hand_resumes_a_gated_worker_promptly() {
    let server = RedisServer::start();
    let mut conn = manager(&server.url()).await;
    let log = Log::default();
    let breaker = CircuitBreakerLayer::new()
        .consecutive_failures(1)
        .break_duration(fixed_break(60))
        .gate_readiness(true);
    let circuit = breaker.circuits().circuit("");
    let svc = breaker.layer(poisoned_handler(&log));
    xadd(&mut conn, "jobs", "poison", "{}").await;
    // Short reads: the worker is soon back waiting for its handler's readiness.
    let cfg = config("jobs", "w1")
        .max_deliveries(1)
        .block(Duration::from_millis(100));
    let worker = start!(Worker::connect(&server.url(), cfg, svc).unwrap());
    eventually("the circuit open", || {
        let open = circuit.state() == tower_once_breaker::CircuitState::Open;
        async move { open }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    xadd(&mut conn, "jobs", "job-1", "{}").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(log.calls("job-1"), 0, "not run while the circuit is open");
    circuit.close();
    let closed = tokio::time::Instant::now();
    let waited = tokio::time::timeout(Duration::from_secs(5), async {
        while log.calls("job-1") == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let _ = worker.stop().await;
    assert!(
        waited.is_ok(),
        "job-1 not run {:?} after the circuit was closed by hand (state {:?})",
        closed.elapsed(),
        circuit.state()
    );
}

/// A handler whose readiness fails while its dependency is down (a pool that cannot
/// connect): it is not ready to run anything. The worker must not fetch entries for it, so
/// the outage costs no delivery; instead each entry is fetched, meets the readiness error,
/// and is redelivered every claim_idle until dead-lettered, never run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_whose_readiness_fails_has_no_entry_fetched() {
    #[derive(Clone)]
    struct Pool {
        down: Arc<AtomicBool>,
        log: Log,
    }
    impl tower::Service<tower_once_worker::Job> for Pool {
        type Response = ();
        type Error = JobError;
        type Future = std::future::Ready<Result<(), JobError>>;
        fn poll_ready(
            &mut self,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Result<(), JobError>> {
            std::task::Poll::Ready(match self.down.load(SeqCst) {
                true => Err(JobError::transient("cannot connect")),
                false => Ok(()),
            })
        }
        fn call(&mut self, job: tower_once_worker::Job) -> Self::Future {
            self.log.record(&job);
            std::future::ready(Ok(()))
        }
    }
    let server = RedisServer::start();
    let mut conn = manager(&server.url()).await;
    let log = Log::default();
    let down = Arc::new(AtomicBool::new(true));
    for i in 0..JOBS {
        xadd(&mut conn, "jobs", &format!("job-{i}"), "{}").await;
    }
    let svc = Pool {
        down: down.clone(),
        log: log.clone(),
    };
    end_outage_after(&down, Duration::from_secs(3));
    let cfg = config("jobs", "w1").max_deliveries(3);
    let worker = start!(Worker::connect(&server.url(), cfg, svc).unwrap());
    eventually("every job run or dead-lettered", || {
        let mut c = conn.clone();
        let outage_over = !down.load(SeqCst);
        let all_ran = log.total() >= JOBS;
        async move {
            let dead = dead_letters(&mut c, "jobs").await.len();
            outage_over && (dead > 0 || (all_ran && pending(&mut c, "jobs").await == 0))
        }
    })
    .await;
    let report = worker.stop().await;
    assert_eq!(
        dead_letters(&mut conn, "jobs").await.len(),
        0,
        "dead-lettered during a 3 s readiness outage, never run ({report:?})"
    );
    assert_eq!(log.total(), JOBS);
    for i in 0..JOBS {
        assert_eq!(
            log.deliveries(&format!("job-{i}")),
            [1],
            "one delivery each"
        );
    }
}
/// Shutdown while the worker waits for its handler's readiness (an isolated circuit): the run
/// must end promptly, not when the circuit admits a call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_while_waiting_for_readiness_is_prompt() {
    let server = RedisServer::start();
    let mut conn = manager(&server.url()).await;
    let log = Log::default();
    let breaker = CircuitBreakerLayer::new()
        .consecutive_failures(1)
        .gate_readiness(true);
    breaker.circuits().circuit("").isolate();
    let svc = breaker.layer(handler(&log, |_| Ok(Duration::ZERO)));
    xadd(&mut conn, "jobs", "job-0", "{}").await;
    let worker = start!(Worker::connect(&server.url(), config("jobs", "w1"), svc).unwrap());
    tokio::time::sleep(Duration::from_millis(500)).await;
    let started = tokio::time::Instant::now();
    let report = worker.stop().await;
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(log.total(), 0);
    assert_eq!(report, tower_once_worker::RunReport::default());
    assert_eq!(pending(&mut conn, "jobs").await, 0, "nothing fetched");
}

/// A concurrency limit shared with other callers, all its permits held elsewhere for 3 s
/// (three job deadlines): the worker fetches nothing until one is free, so no delivery is
/// spent; then every job runs on its first delivery, one at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_concurrency_limit_held_elsewhere_costs_no_delivery() {
    use tower::ServiceExt;
    let server = RedisServer::start();
    let mut conn = manager(&server.url()).await;
    let log = Log::default();
    let svc = tower::limit::ConcurrencyLimitLayer::new(1)
        .layer(handler(&log, |_| Ok(Duration::from_millis(100))));
    let mut holder = svc.clone();
    holder.ready().await.unwrap();
    for i in 0..JOBS {
        xadd(&mut conn, "jobs", &format!("job-{i}"), "{}").await;
    }
    let cfg = config("jobs", "w1")
        .max_deliveries(1)
        .job_deadline(Duration::from_secs(1));
    let worker = start!(Worker::connect(&server.url(), cfg, svc).unwrap());
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        pending(&mut conn, "jobs").await,
        0,
        "fetched while not ready"
    );
    drop(holder);
    eventually("every job acknowledged", || {
        let mut c = conn.clone();
        let ran = log.total() >= JOBS;
        async move { ran && pending(&mut c, "jobs").await == 0 }
    })
    .await;
    let report = worker.stop().await;
    assert_eq!(report.acked, JOBS as u64);
    for i in 0..JOBS {
        assert_eq!(log.deliveries(&format!("job-{i}")), [1], "job-{i}");
    }
}

// Given back unrun: entries read while the handler's readiness lapsed keep their delivery count.

/// A handler whose readiness lapses on demand: each clone is ready when first asked; asked
/// again (the worker's re-check after its read) it is not ready while `lapses` is above 0,
/// which that answer uses up. Counts the times it said "no longer ready".
#[derive(Clone)]
struct Lapsing<S> {
    inner: S,
    lapses: Arc<std::sync::atomic::AtomicU32>,
    lapsed: Arc<std::sync::atomic::AtomicU32>,
    polls: u32,
}

impl<S: tower::Service<tower_once_worker::Job>> tower::Service<tower_once_worker::Job>
    for Lapsing<S>
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), S::Error>> {
        self.polls += 1;
        if self.polls == 2
            && self
                .lapses
                .fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1))
                .is_ok()
        {
            self.lapsed.fetch_add(1, SeqCst);
            // Ready again when asked with a real waker.
            cx.waker().wake_by_ref();
            return std::task::Poll::Pending;
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, job: tower_once_worker::Job) -> Self::Future {
        self.polls = 0;
        self.inner.call(job)
    }
}

/// "Given back unrun, its delivery count restored", for an entry taken over by `XAUTOCLAIM`
/// (deliveries > 1) as well: a job that always fails transiently, each failure followed by
/// two lapses of readiness (its next two fetches are given back), is still dead-lettered
/// after exactly `max_deliveries` (3) handler calls, seeing deliveries 1, 2, 3: the
/// give-backs neither count nor make it run more often.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_taken_over_entry_given_back_keeps_its_count_and_a_poison_job_still_dead_letters() {
    let server = RedisServer::start();
    let mut conn = manager(&server.url()).await;
    let log = Log::default();
    let lapses = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let lapsed = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let inner = handler(&log, {
        let lapses = lapses.clone();
        move |_| {
            lapses.store(2, SeqCst);
            Err(JobError::transient("poison"))
        }
    });
    let svc = Lapsing {
        inner,
        lapses: lapses.clone(),
        lapsed: lapsed.clone(),
        polls: 0,
    };
    xadd(&mut conn, "jobs", "poison", "{}").await;
    let cfg = config("jobs", "w1")
        .max_deliveries(3)
        .block(Duration::from_millis(100));
    let worker = start!(Worker::connect(&server.url(), cfg, svc).unwrap());
    eventually("poison dead-lettered", || {
        let mut c = conn.clone();
        async move { dead_lettered(&mut c, "poison").await }
    })
    .await;
    let _ = worker.stop().await;
    assert_eq!(log.deliveries("poison"), [1, 2, 3]);
    assert_eq!(lapsed.load(SeqCst), 6, "two give-backs after each failure");
    let letters = dead_letters(&mut conn, "jobs").await;
    assert_eq!(letters.len(), 1);
    assert_eq!(
        letters[0].get("deliveries").map(String::as_str),
        Some("4"),
        "{letters:?}"
    );
}

/// Entries of one read given back (the handler's readiness lapsed for two of them) are not
/// lost and run once each, on their first counted delivery.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_given_back_from_a_batch_each_run_once_on_their_first_delivery() {
    let server = RedisServer::start();
    let mut conn = manager(&server.url()).await;
    let log = Log::default();
    let lapses = Arc::new(std::sync::atomic::AtomicU32::new(2));
    let lapsed = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let svc = Lapsing {
        inner: handler(&log, support::ok),
        lapses: lapses.clone(),
        lapsed: lapsed.clone(),
        polls: 0,
    };
    for i in 0..JOBS {
        xadd(&mut conn, "jobs", &format!("job-{i}"), "{}").await;
    }
    let cfg = config("jobs", "w1").max_deliveries(1);
    let worker = start!(Worker::connect(&server.url(), cfg, svc).unwrap());
    eventually("every job acknowledged", || {
        let mut c = conn.clone();
        let ran = log.total() >= JOBS;
        async move { ran && pending(&mut c, "jobs").await == 0 }
    })
    .await;
    let report = worker.stop().await;
    assert_eq!(lapsed.load(SeqCst), 2, "two entries given back");
    assert!(dead_letters(&mut conn, "jobs").await.is_empty());
    assert_eq!(report.acked, JOBS as u64);
    for i in 0..JOBS {
        assert_eq!(log.deliveries(&format!("job-{i}")), [1], "job-{i}");
    }
}
