//! The Postgres fixture of the step tests: a schema of their own, a `PostgresStore` of steps in
//! it (transactional, or plain), and the `refunds` table a refund tool writes its effect to.

use serde::{Deserialize, Serialize};
use tower_once_idempotency::store::postgres::{sqlx, PostgresStore};
use tower_once_test_support::postgres::{database_url, Schema};

/// A refund tool's result: the id of its row in `refunds`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Refunded {
    pub id: i64,
}

/// A schema with a store of steps and a `refunds` table.
pub struct Db {
    pub schema: Schema,
    pub store: PostgresStore,
}

impl Db {
    /// A transactional store on a pool of eight connections.
    pub async fn transactional() -> Self {
        Self::transactional_with(sqlx::postgres::PgPoolOptions::new()).await
    }

    /// A transactional store on a pool of its own options (a connection setting, say), eight
    /// connections.
    pub async fn transactional_with(options: sqlx::postgres::PgPoolOptions) -> Self {
        Self::create(options.max_connections(8), true).await
    }

    /// A plain store on a pool of `connections`.
    pub async fn plain(connections: u32) -> Self {
        Self::create(
            sqlx::postgres::PgPoolOptions::new().max_connections(connections),
            false,
        )
        .await
    }

    async fn create(options: sqlx::postgres::PgPoolOptions, transactional: bool) -> Self {
        let schema = Schema::create();
        let pool = options.connect(&database_url()).await.unwrap();
        let store = PostgresStore::new(pool)
            .table(&format!("{}.steps", schema.name))
            .unwrap();
        let store = if transactional {
            store.transactional()
        } else {
            store
        };
        store.migrate().await.unwrap();
        sqlx::query(&format!(
            "CREATE TABLE {}.refunds (id bigserial PRIMARY KEY, amount int8 NOT NULL)",
            schema.name
        ))
        .execute(store.pool())
        .await
        .unwrap();
        Self { schema, store }
    }

    /// How many refunds are in the table.
    pub async fn refunds(&self) -> i64 {
        sqlx::query_scalar(&format!(
            "SELECT count(*) FROM {}.refunds",
            self.schema.name
        ))
        .fetch_one(self.store.pool())
        .await
        .unwrap()
    }
}

/// The refund step of `run` (its second step, tool `refund`): `POST /refunds` of 40, with 40
/// as its arguments; the caller gives it its policy.
pub fn refund(run: &str) -> tower_once_step::Step<http::Request<String>> {
    let request = http::Request::post("/refunds")
        .body(String::from("40"))
        .unwrap();
    tower_once_step::Step::new(tower_once_step::StepId::new(run, 2, "refund"), request)
        .arguments("40")
}
