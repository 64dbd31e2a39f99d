//! `RunOnceLayer` on the Postgres store, the handler completing its record in the transaction
//! of its effects (crate docs, "Run-once in the job's transaction"): the layer then writes
//! nothing more, a handler whose claim was lost (paused past its lease, the job taken by
//! another delivery) rolls back, and a failed transaction leaves the job to run again.

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;
use tower::{Layer, ServiceExt};
use tower_once_worker::{Job, JobError, JobId, RunOnceLayer, RunOnceOutcome};

mod support;

use support::effects::{begin_effect, EffectsDb};

/// Writes one effect row and the run-once record in one transaction, after `pause` (a
/// blocking one: the thread stops, as in a GC pause, so the lease is not renewed) for the
/// first run, and fails before the commit when `fail_first`.
fn handler(
    schema: String,
    pause: Duration,
    fail_first: bool,
) -> (
    impl tower::Service<Job, Response = (), Error = JobError, Future = impl Send> + Clone,
    Arc<AtomicUsize>,
) {
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&runs);
    let service = tower::service_fn(move |job: Job| {
        let run = counter.fetch_add(1, SeqCst) + 1;
        let schema = schema.clone();
        async move {
            let (claim, mut tx) = begin_effect(&job, &schema).await?;
            if run == 1 {
                std::thread::sleep(pause);
                if fail_first {
                    return Err(JobError::transient("failed before the commit"));
                }
            }
            claim
                .complete_in(&mut tx)
                .await
                .map_err(JobError::transient)?;
            tx.commit().await.map_err(JobError::transient)?;
            Ok(())
        }
    });
    (service, runs)
}

fn job(entry: &str) -> Job {
    Job::new(entry, JobId::new("job-1").unwrap(), "{}", 1)
}

#[tokio::test]
async fn the_record_commits_with_the_effect_and_a_redelivery_is_a_duplicate() {
    let fixture = EffectsDb::new(false).await;
    let (handler, runs) = handler(fixture.schema.name.clone(), Duration::ZERO, false);
    let run_once = RunOnceLayer::new(fixture.store.clone()).layer(handler);
    let first = run_once.clone().oneshot(job("1-0")).await.unwrap();
    assert!(matches!(first, RunOnceOutcome::Done(())));
    let again = run_once.oneshot(job("1-0")).await.unwrap();
    assert!(again.is_duplicate());
    assert_eq!((runs.load(SeqCst), fixture.effects().await), (1, 1));
}

#[tokio::test]
async fn a_failed_transaction_leaves_no_effect_and_the_job_runs_again() {
    let fixture = EffectsDb::new(false).await;
    let (handler, runs) = handler(fixture.schema.name.clone(), Duration::ZERO, true);
    let run_once = RunOnceLayer::new(fixture.store.clone()).layer(handler);
    assert!(run_once.clone().oneshot(job("1-0")).await.is_err());
    assert_eq!(fixture.effects().await, 0);
    let retry = run_once.oneshot(job("1-0")).await.unwrap();
    assert!(!retry.is_duplicate());
    assert_eq!((runs.load(SeqCst), fixture.effects().await), (2, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_paused_past_its_lease_never_commits_a_second_effect() {
    let fixture = EffectsDb::new(false).await;
    let lease = Duration::from_millis(300);
    let (handler, runs) = handler(fixture.schema.name.clone(), lease * 3, false);
    let run_once = RunOnceLayer::new(fixture.store.clone())
        .lease(lease)
        .layer(handler);
    let stale = tokio::spawn(run_once.clone().oneshot(job("1-0")));
    // Taken over once the paused delivery's lease ran out (the worker's XAUTOCLAIM).
    tokio::time::sleep(lease * 2).await;
    let takeover = run_once.clone().oneshot(job("1-0")).await.unwrap();
    assert!(matches!(takeover, RunOnceOutcome::Done(())));
    let stale = stale.await.unwrap();
    let error = stale.expect_err("the paused delivery's claim was lost");
    assert!(error.to_string().contains("claim lost"), "{error}");
    assert_eq!(runs.load(SeqCst), 2, "both ran");
    assert_eq!(fixture.effects().await, 1, "one effect committed");
    assert!(run_once.oneshot(job("1-0")).await.unwrap().is_duplicate());
}

/// A handler that writes its effect, then completes the record inside a savepoint, rolls the
/// savepoint back and commits (the record is not in the commit), or, with `roll_back_all`,
/// rolls the whole transaction back and still returns `Ok`.
fn rolling_back_handler(
    schema: String,
    roll_back_all: bool,
) -> (
    impl tower::Service<Job, Response = (), Error = JobError, Future = impl Send> + Clone,
    Arc<AtomicUsize>,
) {
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&runs);
    let service = tower::service_fn(move |job: Job| {
        let run = counter.fetch_add(1, SeqCst) + 1;
        let schema = schema.clone();
        async move {
            let (claim, mut tx) = begin_effect(&job, &schema).await?;
            if run > 1 {
                claim
                    .complete_in(&mut tx)
                    .await
                    .map_err(JobError::transient)?;
                tx.commit().await.map_err(JobError::transient)?;
                return Ok(());
            }
            if roll_back_all {
                claim
                    .complete_in(&mut tx)
                    .await
                    .map_err(JobError::transient)?;
                tx.rollback().await.map_err(JobError::transient)?;
                return Ok(());
            }
            sqlx::query("SAVEPOINT record")
                .execute(&mut *tx)
                .await
                .map_err(JobError::transient)?;
            claim
                .complete_in(&mut tx)
                .await
                .map_err(JobError::transient)?;
            sqlx::query("ROLLBACK TO SAVEPOINT record")
                .execute(&mut *tx)
                .await
                .map_err(JobError::transient)?;
            tx.commit().await.map_err(JobError::transient)?;
            Ok(())
        }
    });
    (service, runs)
}

/// The layer checks the record, not a flag: a record rolled back with its savepoint (the
/// effect committed) is recorded by the layer, so the redelivery after the lease is a
/// duplicate: one run, one effect.
#[tokio::test]
async fn a_record_rolled_back_with_its_savepoint_is_recorded_by_the_layer() {
    let fixture = EffectsDb::new(false).await;
    let lease = Duration::from_millis(300);
    let (handler, runs) = rolling_back_handler(fixture.schema.name.clone(), false);
    let run_once = RunOnceLayer::new(fixture.store.clone())
        .lease(lease)
        .layer(handler);
    let first = run_once.clone().oneshot(job("1-0")).await.unwrap();
    assert!(matches!(first, RunOnceOutcome::Done(())));
    tokio::time::sleep(lease * 2).await;
    let again = run_once.oneshot(job("1-0")).await.unwrap();
    assert!(again.is_duplicate(), "the redelivery ran the job again");
    assert_eq!((runs.load(SeqCst), fixture.effects().await), (1, 1));
}

/// A handler whose whole transaction rolled back (its effect and its record) but that returned
/// `Ok` has done nothing: the delivery is an error (left pending, not acknowledged), the claim
/// is released at once, and the redelivery runs the job: one effect in the end.
#[tokio::test]
async fn a_record_rolled_back_with_its_transaction_leaves_the_job_to_run_again_at_once() {
    let fixture = EffectsDb::new(false).await;
    let (handler, runs) = rolling_back_handler(fixture.schema.name.clone(), true);
    let run_once = RunOnceLayer::new(fixture.store.clone())
        .lease(Duration::from_secs(60))
        .layer(handler);
    let first = run_once.clone().oneshot(job("1-0")).await;
    assert!(
        first.is_err(),
        "acknowledged a job that did nothing: {first:?}"
    );
    assert_eq!(fixture.effects().await, 0);
    let again = run_once.oneshot(job("1-0")).await.unwrap();
    assert!(
        !again.is_duplicate(),
        "the claim was released at once, not after the lease"
    );
    assert_eq!((runs.load(SeqCst), fixture.effects().await), (2, 1));
}
