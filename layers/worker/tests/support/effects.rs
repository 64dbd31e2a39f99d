//! A schema of its own with a Postgres store for run-once records (`job_runs`) and an
//! `effects` table a job handler writes to: what the run-once tests on Postgres count.

use tower_once_idempotency::store::postgres::PostgresStore;
use tower_once_test_support::postgres::{database_url, Schema};

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
}
