//! `RunOnceLayer` on a transactional Postgres store (`PostgresStore::transactional`): the claim
//! opens the job's transaction with the job's lock, the handler writes its effect on it and
//! `Claim::commit` records the job as done in the same commit; a failure, a panic or a dropped
//! transaction leaves the job to run again at once (no lease to wait out).

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use tower::{Layer, ServiceExt};
use tower_once_idempotency::store::postgres::PostgresStore;
use tower_once_idempotency::Claim;
use tower_once_test_support::postgres::{database_url, Schema};
use tower_once_worker::{Job, JobError, JobId, RunOnceLayer, RunOnceOutcome};

struct Fixture {
    schema: Schema,
    store: PostgresStore,
}

impl Fixture {
    async fn new() -> Self {
        let schema = Schema::create();
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(8)
            .connect(&database_url())
            .await
            .unwrap();
        let store = PostgresStore::new(pool)
            .table(&format!("{}.job_runs", schema.name))
            .unwrap()
            .transactional();
        store.migrate().await.unwrap();
        sqlx::query(&format!(
            "CREATE TABLE {}.effects (job_id text NOT NULL)",
            schema.name
        ))
        .execute(store.pool())
        .await
        .unwrap();
        Self { schema, store }
    }

    async fn effects(&self) -> i64 {
        sqlx::query_scalar(&format!(
            "SELECT count(*) FROM {}.effects",
            self.schema.name
        ))
        .fetch_one(self.store.pool())
        .await
        .unwrap()
    }
}

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
    let fixture = Fixture::new().await;
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
    let fixture = Fixture::new().await;
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
    let fixture = Fixture::new().await;
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
    let fixture = Fixture::new().await;
    let (handler, runs) = handler(fixture.schema.name.clone(), First::Untaken);
    let run_once = RunOnceLayer::new(fixture.store.clone()).layer(handler);
    assert!(matches!(
        run_once.clone().oneshot(job("1-0")).await.unwrap(),
        RunOnceOutcome::Done(())
    ));
    assert!(run_once.oneshot(job("1-0")).await.unwrap().is_duplicate());
    assert_eq!(runs.load(SeqCst), 1);
}
