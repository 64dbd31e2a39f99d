//! A schema of its own with a Postgres store for run-once records (`job_runs`) and an
//! `effects` table a job handler writes to: what the run-once tests on Postgres count.

use tower_once_idempotency::store::postgres::PostgresStore;
use tower_once_idempotency::Claim;
use tower_once_test_support::postgres::{database_url, Schema};
use tower_once_worker::{Job, JobError};

/// A transaction of the job handler's.
pub(crate) type Tx = sqlx::Transaction<'static, sqlx::Postgres>;

/// The job's claim, and a transaction that has written the job's effect row.
pub(crate) async fn begin_effect(
    job: &Job,
    schema: &str,
) -> Result<(Claim<PostgresStore>, Tx), JobError> {
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
    sqlx::query(&format!("INSERT INTO {schema}.effects VALUES ($1)"))
        .bind(job.job_id().as_str())
        .execute(&mut *tx)
        .await
        .map_err(JobError::transient)?;
    Ok((claim, tx))
}

pub(crate) struct EffectsDb {
    pub(crate) schema: Schema,
    pub(crate) store: PostgresStore,
}

impl EffectsDb {
    /// The store in the default two-step mode, or `transactional`.
    pub(crate) async fn new(transactional: bool) -> Self {
        let schema = Schema::create();
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(8)
            .connect(&database_url())
            .await
            .unwrap();
        let mut store = PostgresStore::new(pool)
            .table(&format!("{}.job_runs", schema.name))
            .unwrap();
        if transactional {
            store = store.transactional();
        }
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

    /// How many effect rows committed.
    pub(crate) async fn effects(&self) -> i64 {
        sqlx::query_scalar(&format!(
            "SELECT count(*) FROM {}.effects",
            self.schema.name
        ))
        .fetch_one(self.store.pool())
        .await
        .unwrap()
    }

    /// How many effect rows of job `id` committed.
    pub(crate) async fn effects_of(&self, id: &str) -> i64 {
        sqlx::query_scalar(&format!(
            "SELECT count(*) FROM {}.effects WHERE job_id = $1",
            self.schema.name
        ))
        .bind(id)
        .fetch_one(self.store.pool())
        .await
        .unwrap()
    }
}
