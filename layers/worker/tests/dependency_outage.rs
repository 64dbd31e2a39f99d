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
