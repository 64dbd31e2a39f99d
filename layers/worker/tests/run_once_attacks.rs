//! Attacks on `RunOnceLayer` as the step mechanism: cut, dropped and panicking runs, a slow or
//! restarted Redis, a deadline that passes during the claim.

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use tower::{Layer, Service, ServiceExt};
use tower_once_idempotency::store::redis::RedisStore;
use tower_once_idempotency::store::MemoryStore;
use tower_once_test_support::redis::RedisServer;
use tower_once_timeout::Deadline;
use tower_once_worker::{Job, JobError, JobId, RunOnceLayer, RunOnceOutcome};

fn job(entry: &str, id: &str) -> Job {
    Job::new(entry, JobId::new(id).unwrap(), "{}", 1)
}

fn counting() -> (
    impl tower::Service<Job, Response = (), Error = JobError, Future = impl Send> + Clone,
    Arc<AtomicUsize>,
) {
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&runs);
    let service = tower::service_fn(move |_job: Job| {
        counter.fetch_add(1, SeqCst);
        async { Ok::<_, JobError>(()) }
    });
    (service, runs)
}

/// A job's deadline does not bound its claim: Redis is slow for 300 ms (SIGSTOP, then SIGCONT:
/// well within the store's own 1 s command timeout, so the store answers) and the delivery's
/// deadline is 100 ms away. The claim is answered and the handler runs (its own timeout layers
/// see the deadline in scope); the run is not `is_store`, which means the store did not answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_passing_during_a_slow_claim_is_not_a_store_failure() {
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let (handler, runs) = counting();
    let run_once = RunOnceLayer::new(store).layer(handler);
    let delivery = job("1-0", "late-1").with_deadline(Deadline::after(Duration::from_millis(100)));
    server.signal("-STOP");
    let (outcome, ()) = tokio::join!(run_once.clone().oneshot(delivery), async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        server.signal("-CONT");
    });
    if let Err(error) = &outcome {
        assert!(
            !error.is_store(),
            "a store that answered reported as failed ({error}); handler runs: {}",
            runs.load(SeqCst)
        );
    }
    assert!(matches!(outcome, Ok(RunOnceOutcome::Done(()))));
    assert_eq!(runs.load(SeqCst), 1);
}

/// A run-once future made by `call` and dropped before its
/// first poll (a `Buffer` or worker shutting down between `call` and the first poll) takes no
/// claim. The old layer made the claim in `call` (the memory store claims eagerly), and its drop
/// in `Claiming` released nothing: another entry with the same job id was then acknowledged as a
/// Duplicate of a run that never happened.
#[tokio::test(start_paused = true)]
async fn a_future_dropped_before_its_first_poll_claims_nothing() {
    let (handler, runs) = counting();
    let mut run_once = RunOnceLayer::new(MemoryStore::new())
        .lease(Duration::from_secs(3600))
        .layer(handler);
    std::future::poll_fn(|cx| run_once.poll_ready(cx))
        .await
        .unwrap();
    drop(run_once.call(job("1-0", "never-polled")));
    let other = run_once.clone().oneshot(job("2-0", "never-polled")).await;
    assert!(
        matches!(other, Ok(RunOnceOutcome::Done(()))),
        "the job was answered {other:?} without running"
    );
    assert_eq!(runs.load(SeqCst), 1);
}

/// A handler that panics in `call` (synchronously, before
/// returning its future): the claim is released at once. The old layer called the handler while
/// still in `Claiming`, and its drop released only `Running`/`Checking`: the job id stayed
/// claimed for the lease (here an hour), each redelivery `is_in_progress`.
#[tokio::test(start_paused = true)]
async fn a_handler_panicking_in_call_releases_its_claim_at_once() {
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&calls);
    let handler = tower::service_fn(move |_job: Job| {
        if counter.fetch_add(1, SeqCst) == 0 {
            panic!("bad payload, in call");
        }
        async { Ok::<_, JobError>(()) }
    });
    let run_once = RunOnceLayer::new(MemoryStore::new())
        .lease(Duration::from_secs(3600))
        .layer(handler);
    let first = tokio::spawn(run_once.clone().oneshot(job("1-0", "panics")));
    assert!(first.await.unwrap_err().is_panic());
    // Let a release spawned on a task of its own run.
    tokio::task::yield_now().await;
    let again = run_once.clone().oneshot(job("1-0", "panics")).await;
    assert!(
        matches!(again, Ok(RunOnceOutcome::Done(()))),
        "the redelivery after the panic: {:?}",
        again.map_err(|e| e.to_string())
    );
    assert_eq!(calls.load(SeqCst), 2);
}

/// A run cut while its claim is on its way to Redis:
/// Redis is frozen (SIGSTOP) so the claim is sent and not answered, the run is cut after 100 ms
/// (a caller's timeout, the worker's deadline), then Redis thaws and makes the claim. The step
/// mechanism's `Pending` finishes the claim on a task and releases it, so the same entry's
/// redelivery runs. The old layer dropped the claim future in `Claiming` and released nothing:
/// the job id stayed claimed for the lease (an hour here), every redelivery `is_in_progress`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_dropped_during_the_claim_round_trip_leaves_the_job_free() {
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let (handler, runs) = counting();
    let run_once = RunOnceLayer::new(store)
        .lease(Duration::from_secs(3600))
        .layer(handler);
    // Load the store's scripts (first use), so the cut claim is one EVALSHA that runs on thaw.
    run_once
        .clone()
        .oneshot(job("0-1", "warm-up"))
        .await
        .unwrap();
    server.signal("-STOP");
    let cut = tokio::time::timeout(
        Duration::from_millis(100),
        run_once.clone().oneshot(job("1-0", "cut-claim")),
    )
    .await;
    server.signal("-CONT");
    assert!(cut.is_err(), "cut in the claim round trip");
    let mut last = None;
    for _ in 0..200 {
        let outcome = run_once.clone().oneshot(job("1-0", "cut-claim")).await;
        if matches!(outcome, Ok(RunOnceOutcome::Done(()))) {
            last = None;
            break;
        }
        last = Some(outcome.map_err(|e| e.to_string()));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(last.is_none(), "never ran again: last {last:?}");
    assert_eq!(runs.load(SeqCst), 2, "warm-up and the redelivery");
}

/// Redis goes away while the handler runs; the handler returns
/// `Ok`: the record cannot be written, and the run is acknowledged `Done` (its effect happened),
/// as the old layer did (a warning, no error).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_failure_while_recording_after_ok_is_acknowledged_done() {
    let mut server = RedisServer::start();
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let (started, go) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let (s, g) = (started.clone(), go.clone());
    let handler = tower::service_fn(move |_job: Job| {
        let (s, g) = (s.clone(), g.clone());
        async move {
            s.notify_one();
            g.notified().await;
            Ok::<_, JobError>("effect")
        }
    });
    let run_once = RunOnceLayer::new(store).layer(handler);
    let running = tokio::spawn(run_once.clone().oneshot(job("1-0", "record-fails")));
    started.notified().await;
    server.stop();
    go.notify_one();
    let outcome = running.await.unwrap();
    assert!(
        matches!(outcome, Ok(RunOnceOutcome::Done("effect"))),
        "{:?}",
        outcome.map_err(|e| e.to_string())
    );
}

/// Redis restarts (no persistence) while the handler runs: its
/// claim is gone, the completion finds no claim (`Ok(false)`), the run is acknowledged `Done`;
/// a later delivery of another entry with the same job id then runs the effect again (nothing
/// recorded it). A limit of any store without durable claims, unchanged by the move.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_restart_while_running_loses_the_claim_and_the_record() {
    let mut server = RedisServer::start();
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let (started, go) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let (r, s, g) = (runs.clone(), started.clone(), go.clone());
    let handler = tower::service_fn(move |_job: Job| {
        let n = r.fetch_add(1, SeqCst);
        let (s, g) = (s.clone(), g.clone());
        async move {
            if n == 0 {
                s.notify_one();
                g.notified().await;
            }
            Ok::<_, JobError>(())
        }
    });
    let run_once = RunOnceLayer::new(store).layer(handler);
    let running = tokio::spawn(run_once.clone().oneshot(job("1-0", "restart")));
    started.notified().await;
    server.stop();
    server.restart();
    go.notify_one();
    let first = running.await.unwrap();
    assert!(
        matches!(first, Ok(RunOnceOutcome::Done(()))),
        "{:?}",
        first.map_err(|e| e.to_string())
    );
    // The connection manager reconnects; retry through the reconnect.
    let mut second = None;
    for _ in 0..100 {
        match run_once.clone().oneshot(job("2-0", "restart")).await {
            Ok(outcome) => {
                second = Some(outcome);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
    assert_eq!(second, Some(RunOnceOutcome::Done(())), "the job ran again");
    assert_eq!(runs.load(SeqCst), 2, "two effects for one job id");
}
