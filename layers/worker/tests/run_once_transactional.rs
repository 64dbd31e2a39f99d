//! `RunOnceLayer` on a transactional Postgres store (`PostgresStore::transactional`): the claim
//! opens the job's transaction with the job's lock, the handler writes its effect on it and
//! `Claim::commit` records the job as done in the same commit; a failure, a panic or a dropped
//! transaction leaves the job to run again at once (no lease to wait out), and never twice at
//! once; a run cancelled or panicking before it took the transaction releases its claim at once;
//! a handler that returns `Ok` while its transaction is still held elsewhere is not taken at its
//! word.

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;
use tower::{Layer, ServiceExt};
use tower_once_idempotency::store::postgres::PostgresStore;
use tower_once_idempotency::Claim;
use tower_once_worker::{Job, JobError, JobId, RunOnceLayer, RunOnceOutcome};

mod support;

use support::effects::EffectsDb;

/// What the handler does on its first run; later runs commit.
#[derive(Clone, Copy)]
enum First {
    Commit,
    /// Writes the effect, then fails before the commit.
    Fail,
    /// Writes the effect, drops the transaction, and returns `Ok` anyway.
    DropAndSucceed,
    /// Never takes the transaction; succeeds.
    Untaken,
}

fn handler(
    schema: String,
    first: First,
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
            let plan = if run == 1 { first } else { First::Commit };
            let claim = job
                .extensions()
                .get::<Claim<PostgresStore>>()
                .cloned()
                .ok_or_else(|| JobError::permanent("no claim"))?;
            if let First::Untaken = plan {
                return Ok(());
            }
            let mut tx = claim.transaction().await.map_err(JobError::transient)?;
            sqlx::query(&format!("INSERT INTO {schema}.effects VALUES ($1)"))
                .bind(job.job_id().as_str())
                .execute(&mut *tx)
                .await
                .map_err(JobError::transient)?;
            match plan {
                First::Fail => return Err(JobError::transient("failed before the commit")),
                First::DropAndSucceed => {
                    drop(tx);
                    return Ok(());
                }
                _ => {}
            }
            claim.commit(tx, ()).await.map_err(JobError::transient)?;
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
    let fixture = EffectsDb::new(true).await;
    let (handler, runs) = handler(fixture.schema.name.clone(), First::Commit);
    let run_once = RunOnceLayer::new(fixture.store.clone()).layer(handler);
    let first = run_once.clone().oneshot(job("1-0")).await.unwrap();
    assert!(matches!(first, RunOnceOutcome::Done(())));
    let again = run_once.oneshot(job("2-0")).await.unwrap();
    assert!(again.is_duplicate());
    assert_eq!((runs.load(SeqCst), fixture.effects().await), (1, 1));
}

#[tokio::test]
async fn a_failed_run_leaves_no_effect_and_the_job_runs_again_at_once() {
    let fixture = EffectsDb::new(true).await;
    let (handler, runs) = handler(fixture.schema.name.clone(), First::Fail);
    let run_once = RunOnceLayer::new(fixture.store.clone()).layer(handler);
    assert!(run_once.clone().oneshot(job("1-0")).await.is_err());
    assert_eq!(fixture.effects().await, 0);
    let retry = run_once.clone().oneshot(job("1-0")).await.unwrap();
    assert!(matches!(retry, RunOnceOutcome::Done(())));
    assert_eq!((runs.load(SeqCst), fixture.effects().await), (2, 1));
    assert!(run_once.oneshot(job("1-0")).await.unwrap().is_duplicate());
}

#[tokio::test]
async fn a_dropped_transaction_with_ok_is_an_error_and_the_job_runs_again() {
    let fixture = EffectsDb::new(true).await;
    let (handler, runs) = handler(fixture.schema.name.clone(), First::DropAndSucceed);
    let run_once = RunOnceLayer::new(fixture.store.clone()).layer(handler);
    let first = run_once.clone().oneshot(job("1-0")).await;
    let error = first.expect_err("nothing committed: not acknowledged");
    assert!(error.to_string().contains("rolled back"), "{error}");
    assert_eq!(fixture.effects().await, 0);
    let retry = run_once.oneshot(job("1-0")).await.unwrap();
    assert!(matches!(retry, RunOnceOutcome::Done(())));
    assert_eq!((runs.load(SeqCst), fixture.effects().await), (2, 1));
}

#[tokio::test]
async fn a_handler_that_never_takes_the_transaction_is_recorded_by_the_layer() {
    let fixture = EffectsDb::new(true).await;
    let (handler, runs) = handler(fixture.schema.name.clone(), First::Untaken);
    let run_once = RunOnceLayer::new(fixture.store.clone()).layer(handler);
    assert!(matches!(
        run_once.clone().oneshot(job("1-0")).await.unwrap(),
        RunOnceOutcome::Done(())
    ));
    assert!(run_once.oneshot(job("1-0")).await.unwrap().is_duplicate());
    assert_eq!(runs.load(SeqCst), 1);
}

// Attacks: panics, cancellations, killed connections, transactions handed to tasks.

fn job_of(entry: &str, id: &str) -> Job {
    Job::new(entry, JobId::new(id).unwrap(), "{}", 1)
}

fn claim_of(job: &Job) -> Result<Claim<PostgresStore>, JobError> {
    job.extensions()
        .get::<Claim<PostgresStore>>()
        .cloned()
        .ok_or_else(|| JobError::permanent("no claim"))
}

async fn effect(schema: &str, job: &Job, tx: &mut sqlx::PgConnection) -> Result<(), JobError> {
    sqlx::query(&format!("INSERT INTO {schema}.effects VALUES ($1)"))
        .bind(job.job_id().as_str())
        .execute(tx)
        .await
        .map_err(JobError::transient)?;
    Ok(())
}

/// A handler whose first run does `first`, later runs commit one effect.
fn handler_with<F, Fut>(
    schema: String,
    first: F,
) -> (
    impl tower::Service<Job, Response = (), Error = JobError, Future = impl Send> + Clone,
    Arc<AtomicUsize>,
)
where
    F: Fn(String, Job, Claim<PostgresStore>) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<(), JobError>> + Send + 'static,
{
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&runs);
    let service = tower::service_fn(move |job: Job| {
        let run = counter.fetch_add(1, SeqCst) + 1;
        let schema = schema.clone();
        let first = first.clone();
        async move {
            let claim = claim_of(&job)?;
            if run == 1 {
                return first(schema, job, claim).await;
            }
            let mut tx = claim.transaction().await.map_err(JobError::transient)?;
            effect(&schema, &job, &mut tx).await?;
            claim.commit(tx, ()).await.map_err(JobError::transient)?;
            Ok(())
        }
    });
    (service, runs)
}

const LEASE: Duration = Duration::from_secs(4);

/// Sends the job until it runs (every 100 ms, bounded by 3 leases): the last answer, and how long
/// it took.
async fn retry_until_run<S>(
    run_once: &S,
    id: &str,
) -> (
    Result<RunOnceOutcome<()>, tower_once_worker::run_once::RunOnceError<JobError>>,
    Duration,
)
where
    S: tower::Service<
            Job,
            Response = RunOnceOutcome<()>,
            Error = tower_once_worker::run_once::RunOnceError<JobError>,
        > + Clone,
{
    let start = tokio::time::Instant::now();
    let mut last = run_once.clone().oneshot(job_of("1-0", id)).await;
    while !matches!(last, Ok(RunOnceOutcome::Done(()))) && start.elapsed() < LEASE * 3 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        last = run_once.clone().oneshot(job_of("1-0", id)).await;
    }
    (last, start.elapsed())
}

fn describe<T: std::fmt::Debug, E: std::fmt::Display>(r: &Result<RunOnceOutcome<T>, E>) -> String {
    match r {
        Ok(o) => format!("Ok({o:?})"),
        Err(e) => format!("Err({e})"),
    }
}

/// A handler that panics before it takes its transaction (validating the payload, say): the
/// dropped run releases its claim, on a task of its own, so the job runs again well within the
/// lease (it once stayed locked until Postgres' idle timeout, the lease, ended the session; a
/// retry sent the very instant the panic is reported may still meet the release in flight).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_before_taking_the_transaction_frees_the_job_at_once() {
    let fixture = EffectsDb::new(true).await;
    let (h, runs) = handler_with(fixture.schema.name.clone(), |_, _, _| async {
        panic!("bad payload");
    });
    let run_once = RunOnceLayer::new(fixture.store.clone())
        .lease(LEASE)
        .layer(h);
    let first = tokio::spawn(run_once.clone().oneshot(job_of("1-0", "job-p")));
    assert!(first.await.unwrap_err().is_panic());
    let (retry, waited) = retry_until_run(&run_once, "job-p").await;
    assert!(
        matches!(retry, Ok(RunOnceOutcome::Done(()))) && waited < LEASE,
        "retry right after the panic: {} (runs {}, effects {}), ran again only after {waited:?}",
        describe(&retry),
        runs.load(SeqCst),
        fixture.effects().await
    );
    assert_eq!((runs.load(SeqCst), fixture.effects().await), (2, 1));
}

/// The same with the run cancelled (a `TimeoutLayer`, the worker's deadline, a shutdown that
/// drops in-flight handlers) before the handler took its transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_cancelled_before_taking_the_transaction_frees_the_job_at_once() {
    let fixture = EffectsDb::new(true).await;
    let (h, runs) = handler_with(fixture.schema.name.clone(), |_, _, _| async {
        tokio::time::sleep(Duration::from_secs(10)).await;
        Ok(())
    });
    let run_once = RunOnceLayer::new(fixture.store.clone())
        .lease(LEASE)
        .layer(h);
    let cut = tokio::time::timeout(
        Duration::from_millis(300),
        run_once.clone().oneshot(job_of("1-0", "job-c")),
    )
    .await;
    assert!(cut.is_err(), "timed out");
    let (retry, waited) = retry_until_run(&run_once, "job-c").await;
    assert!(
        matches!(retry, Ok(RunOnceOutcome::Done(()))) && waited < LEASE,
        "retry right after the cancelled run: {} (runs {}, effects {}), ran again only after {waited:?}",
        describe(&retry),
        runs.load(SeqCst),
        fixture.effects().await
    );
    assert_eq!((runs.load(SeqCst), fixture.effects().await), (2, 1));
}

/// A panic after the effect was written on the taken transaction: rolled back, runs again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_after_writing_the_effect_rolls_back_and_runs_again_at_once() {
    let fixture = EffectsDb::new(true).await;
    let (h, runs) = handler_with(
        fixture.schema.name.clone(),
        |schema, job, claim| async move {
            let mut tx = claim.transaction().await.map_err(JobError::transient)?;
            effect(&schema, &job, &mut tx).await?;
            panic!("after the effect");
        },
    );
    let run_once = RunOnceLayer::new(fixture.store.clone()).layer(h);
    let first = tokio::spawn(run_once.clone().oneshot(job_of("1-0", "job-q")));
    assert!(first.await.unwrap_err().is_panic());
    let retry = run_once.clone().oneshot(job_of("1-0", "job-q")).await;
    assert!(
        matches!(retry, Ok(RunOnceOutcome::Done(()))),
        "{}",
        describe(&retry)
    );
    assert_eq!((runs.load(SeqCst), fixture.effects().await), (2, 1));
}

/// Many failed runs each retried the instant they return: the dropped transaction's connection
/// is closed in the background, so the retry may still find the lock held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_failed_run_is_retried_at_once_without_in_progress() {
    let fixture = EffectsDb::new(true).await;
    let mut busy = 0;
    let mut outcomes = Vec::new();
    for i in 0..40 {
        // A fresh service each time, so each job's first run fails.
        let (h, _) = handler_with(
            fixture.schema.name.clone(),
            |schema, job, claim| async move {
                let mut tx = claim.transaction().await.map_err(JobError::transient)?;
                effect(&schema, &job, &mut tx).await?;
                Err(JobError::transient("failed before the commit"))
            },
        );
        let run_once = RunOnceLayer::new(fixture.store.clone()).layer(h);
        let id = format!("job-f{i}");
        assert!(run_once.clone().oneshot(job_of("1-0", &id)).await.is_err());
        let retry = run_once.clone().oneshot(job_of("1-0", &id)).await;
        if !matches!(retry, Ok(RunOnceOutcome::Done(()))) {
            busy += 1;
            outcomes.push(describe(&retry));
        }
    }
    assert_eq!(busy, 0, "retries not run at once: {outcomes:?}");
    assert_eq!(fixture.effects().await, 40 - busy);
}

/// The handler's connection is terminated while it holds the transaction; its next statement
/// fails; the job runs again at once, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_connection_mid_handler_runs_the_job_again_at_once() {
    let fixture = EffectsDb::new(true).await;
    let pool = fixture.store.pool().clone();
    let (h, runs) = handler_with(fixture.schema.name.clone(), move |schema, job, claim| {
        let pool = pool.clone();
        async move {
            let mut tx = claim.transaction().await.map_err(JobError::transient)?;
            effect(&schema, &job, &mut tx).await?;
            let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
                .fetch_one(&mut *tx)
                .await
                .map_err(JobError::transient)?;
            sqlx::query("SELECT pg_terminate_backend($1)")
                .bind(pid)
                .execute(&pool)
                .await
                .map_err(JobError::transient)?;
            tokio::time::sleep(Duration::from_millis(100)).await;
            effect(&schema, &job, &mut tx).await?;
            claim.commit(tx, ()).await.map_err(JobError::transient)?;
            Ok(())
        }
    });
    let run_once = RunOnceLayer::new(fixture.store.clone()).layer(h);
    let first = run_once.clone().oneshot(job_of("1-0", "job-k")).await;
    assert!(first.is_err(), "{}", describe(&first));
    let retry = run_once.clone().oneshot(job_of("1-0", "job-k")).await;
    assert!(
        matches!(retry, Ok(RunOnceOutcome::Done(()))),
        "{}",
        describe(&retry)
    );
    assert_eq!((runs.load(SeqCst), fixture.effects().await), (2, 1));
}

/// The handler commits its effect and record, then fails on a later step: the job must not
/// run again (its effect committed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_after_the_commit_never_runs_the_job_again() {
    let fixture = EffectsDb::new(true).await;
    let (h, runs) = handler_with(
        fixture.schema.name.clone(),
        |schema, job, claim| async move {
            let mut tx = claim.transaction().await.map_err(JobError::transient)?;
            effect(&schema, &job, &mut tx).await?;
            claim.commit(tx, ()).await.map_err(JobError::transient)?;
            Err(JobError::transient("a later step failed"))
        },
    );
    let run_once = RunOnceLayer::new(fixture.store.clone()).layer(h);
    assert!(run_once
        .clone()
        .oneshot(job_of("1-0", "job-e"))
        .await
        .is_err());
    let retry = run_once.clone().oneshot(job_of("1-0", "job-e")).await;
    assert!(
        matches!(retry, Ok(RunOnceOutcome::Duplicate)),
        "{}",
        describe(&retry)
    );
    assert_eq!((runs.load(SeqCst), fixture.effects().await), (1, 1));
}

/// The handler hands its transaction to a task and returns `Ok` before that task is done with
/// it; the task then drops it (nothing committed). The run is acknowledged as done with no
/// effect: no redelivery will ever run it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ok_returned_while_the_transaction_is_still_held_is_not_acknowledged_without_a_commit() {
    let fixture = EffectsDb::new(true).await;
    let (h, runs) = handler_with(
        fixture.schema.name.clone(),
        |schema, job, claim| async move {
            let mut tx = claim.transaction().await.map_err(JobError::transient)?;
            effect(&schema, &job, &mut tx).await?;
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(200)).await;
                drop(tx);
            });
            Ok(())
        },
    );
    let run_once = RunOnceLayer::new(fixture.store.clone()).layer(h);
    let first = run_once.clone().oneshot(job_of("1-0", "job-h")).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let effects = fixture.effects().await;
    assert!(
        !(matches!(first, Ok(RunOnceOutcome::Done(()))) && effects == 0),
        "acknowledged as done ({}) with {effects} effects and {} runs",
        describe(&first),
        runs.load(SeqCst)
    );
}

/// Duplicates while the job runs: the same entry, and another entry with the job id: never run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicates_while_the_job_runs_never_run_it() {
    let fixture = EffectsDb::new(true).await;
    let gate = Arc::new(tokio::sync::Notify::new());
    let g = Arc::clone(&gate);
    let (h, runs) = handler_with(fixture.schema.name.clone(), move |schema, job, claim| {
        let g = Arc::clone(&g);
        async move {
            let mut tx = claim.transaction().await.map_err(JobError::transient)?;
            effect(&schema, &job, &mut tx).await?;
            g.notified().await;
            claim.commit(tx, ()).await.map_err(JobError::transient)?;
            Ok(())
        }
    });
    let run_once = RunOnceLayer::new(fixture.store.clone()).layer(h);
    let first = tokio::spawn(run_once.clone().oneshot(job_of("1-0", "job-d")));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let same = run_once.clone().oneshot(job_of("1-0", "job-d")).await;
    let other = run_once.clone().oneshot(job_of("2-0", "job-d")).await;
    gate.notify_one();
    let first = first.await.unwrap();
    assert!(
        matches!(first, Ok(RunOnceOutcome::Done(()))),
        "{}",
        describe(&first)
    );
    for r in [&same, &other] {
        assert!(
            matches!(r, Ok(RunOnceOutcome::Duplicate))
                || r.as_ref().is_err_and(|e| e.is_in_progress()),
            "{}",
            describe(r)
        );
    }
    assert_eq!((runs.load(SeqCst), fixture.effects().await), (1, 1));
}
