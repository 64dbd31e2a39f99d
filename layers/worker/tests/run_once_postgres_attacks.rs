//! Attacks on `RunOnceLayer` on the plain Postgres store, the handler writing its record in its
//! own transaction (`Claim::complete_in`): what the layer's read of the record after `Ok` sees.

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;
use tower::{Layer, ServiceExt};
use tower_once_idempotency::store::postgres::PostgresStore;
use tower_once_idempotency::Claim;
use tower_once_worker::{Job, JobError, JobId, RunOnceLayer, RunOnceOutcome};

mod support;

use support::effects::{begin_effect, EffectsDb, Tx};

fn job(entry: &str, id: &str) -> Job {
    Job::new(entry, JobId::new(id).unwrap(), "{}", 1)
}

/// A handler whose first run of each job does `first` with its claim and its transaction (the
/// effect and the record written on it); later runs commit.
fn handler_with<F, Fut>(
    schema: String,
    first: F,
) -> (
    impl tower::Service<Job, Response = (), Error = JobError, Future = impl Send> + Clone,
    Arc<AtomicUsize>,
)
where
    F: Fn(Claim<PostgresStore>, Tx) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<(), JobError>> + Send + 'static,
{
    let runs = Arc::new(AtomicUsize::new(0));
    let seen = Arc::new(std::sync::Mutex::new(std::collections::HashSet::new()));
    let counter = Arc::clone(&runs);
    let service = tower::service_fn(move |job: Job| {
        counter.fetch_add(1, SeqCst);
        let is_first = seen
            .lock()
            .unwrap()
            .insert(job.job_id().as_str().to_owned());
        let (schema, first) = (schema.clone(), first.clone());
        async move {
            let (claim, mut tx) = begin_effect(&job, &schema).await?;
            claim
                .complete_in(&mut tx)
                .await
                .map_err(JobError::transient)?;
            if is_first {
                return first(claim, tx).await;
            }
            tx.commit().await.map_err(JobError::transient)?;
            Ok(())
        }
    });
    (service, runs)
}

/// The handler writes its effect and record, then drops its transaction (forgot to commit) and
/// returns `Ok`. sqlx only queues the ROLLBACK on drop, so the layer's read of the record can
/// find the transaction still open: it looks again until it ends (rolled back: the run is an
/// error and the job runs again), and never acknowledges a run whose record did not commit.
/// Sixty jobs, so the race shows (about one in seven found it open).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_uncommitted_transaction_with_ok_is_never_acknowledged_done() {
    let fixture = EffectsDb::new(false).await;
    let (handler, _runs) = handler_with(fixture.schema.name.clone(), |_claim, tx| async move {
        drop(tx);
        Ok(())
    });
    let run_once = RunOnceLayer::new(fixture.store.clone()).layer(handler);
    let mut lost = Vec::new();
    for i in 0..60 {
        let id = format!("dropped-{i}");
        let first = run_once.clone().oneshot(job("1-0", &id)).await;
        if matches!(first, Ok(RunOnceOutcome::Done(()))) && fixture.effects_of(&id).await == 0 {
            lost.push(id);
        }
    }
    assert!(
        lost.is_empty(),
        "acknowledged Done with no effect: {lost:?}"
    );
}

/// The handler hands its transaction (the effect and the record written on it) to a task and
/// returns `Ok`; the task drops it 200 ms later. The layer's read finds it open, looks again
/// until it ends, and the rolled-back run is an error: the job runs again, one effect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ok_while_the_transaction_is_held_by_a_task_is_never_acknowledged_without_a_commit() {
    let fixture = EffectsDb::new(false).await;
    let (handler, runs) = handler_with(fixture.schema.name.clone(), |_claim, tx| async move {
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            drop(tx);
        });
        Ok(())
    });
    let run_once = RunOnceLayer::new(fixture.store.clone()).layer(handler);
    let first = run_once.clone().oneshot(job("1-0", "held")).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let effects = fixture.effects().await;
    assert!(
        !(matches!(first, Ok(RunOnceOutcome::Done(()))) && effects == 0),
        "acknowledged Done ({first:?}) with {effects} effects and {} runs",
        runs.load(SeqCst)
    );
}

/// The handler rolls its transaction back (effect and record) and returns `Ok`, leaving the
/// store's pool exhausted for a while (connections held by a task), so the layer's read of the
/// record fails. The run is not acknowledged: an error leaves it pending with its claim held to
/// its lease, and the record (here: never committed) decides the next delivery, which runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_read_of_a_rolled_back_record_is_not_acknowledged_done() {
    let fixture = EffectsDb::new(false).await;
    let store = fixture
        .store
        .clone()
        .command_timeout(Duration::from_millis(300));
    let (handler, runs) = handler_with(fixture.schema.name.clone(), |claim, tx| async move {
        tx.rollback().await.map_err(JobError::transient)?;
        // Every pooled connection, held past the store's command timeout.
        let pool = claim.store().pool().clone();
        let mut held = Vec::new();
        while let Ok(Ok(connection)) =
            tokio::time::timeout(Duration::from_millis(100), pool.acquire()).await
        {
            held.push(connection);
        }
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(800)).await;
            drop(held);
        });
        Ok(())
    });
    let run_once = RunOnceLayer::new(store).layer(handler);
    let first = run_once.clone().oneshot(job("1-0", "unread")).await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let effects = fixture.effects().await;
    assert!(
        !(matches!(first, Ok(RunOnceOutcome::Done(()))) && effects == 0),
        "acknowledged Done ({first:?}) with {effects} effects and {} runs",
        runs.load(SeqCst)
    );
}

/// A SERIALIZABLE handler that outlives a renewal of its lease
/// (300 ms lease, renewed at 100 ms, handler 250 ms): the renewal updated the record's row after
/// the handler's snapshot, so its `complete_in` fails to serialize, the run is an error and
/// released, and the rerun commits: one effect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_serializable_handler_outliving_a_renewal_runs_once_in_the_end() {
    let fixture = EffectsDb::new(false).await;
    let schema = fixture.schema.name.clone();
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&runs);
    let handler = tower::service_fn(move |job: Job| {
        let run = counter.fetch_add(1, SeqCst) + 1;
        let schema = schema.clone();
        async move {
            let claim = job
                .extensions()
                .get::<Claim<PostgresStore>>()
                .cloned()
                .ok_or_else(|| JobError::permanent("no claim"))?;
            let mut tx = claim
                .store()
                .pool()
                .begin()
                .await
                .map_err(JobError::transient)?;
            sqlx::query("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE")
                .execute(&mut *tx)
                .await
                .map_err(JobError::transient)?;
            sqlx::query(&format!("INSERT INTO {schema}.effects VALUES ($1)"))
                .bind(job.job_id().as_str())
                .execute(&mut *tx)
                .await
                .map_err(JobError::transient)?;
            if run == 1 {
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            claim
                .complete_in(&mut tx)
                .await
                .map_err(JobError::transient)?;
            tx.commit().await.map_err(JobError::transient)?;
            Ok::<_, JobError>(())
        }
    });
    let run_once = RunOnceLayer::new(fixture.store.clone())
        .lease(Duration::from_millis(300))
        .layer(handler);
    let mut outcome = run_once.clone().oneshot(job("1-0", "serial")).await;
    for _ in 0..5 {
        if outcome.is_ok() {
            break;
        }
        outcome = run_once.clone().oneshot(job("1-0", "serial")).await;
    }
    assert!(
        matches!(outcome, Ok(RunOnceOutcome::Done(()))),
        "{:?}",
        outcome.map_err(|e| e.to_string())
    );
    assert!(run_once
        .oneshot(job("2-0", "serial"))
        .await
        .unwrap()
        .is_duplicate());
    assert_eq!(fixture.effects().await, 1);
    assert_eq!(
        runs.load(SeqCst),
        2,
        "the first run failed to serialize, the rerun committed"
    );
}
