//! Steps kept in a plain (not transactional) `PostgresStore`: a store "that writes its claims"
//! (`tower_once_step::postgres`: keep unkeyed steps there), whose result is a write after the
//! call (crate docs, Known limits). The step still hands its tool a `Claim` in the request's
//! extensions (the store completes in transaction), undocumented for steps: what a tool that
//! uses it gets. And a step dropped while its write waits for a pooled connection (the store
//! contract: a layer finishes the operations it drops). Real time (Postgres's clock and pool);
//! effects counted as tool runs and rows.
#![cfg(feature = "postgres")]

mod support;

use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;
use tower::{BoxError, Layer, ServiceExt};
use tower_once_idempotency::store::postgres::{sqlx, PostgresStore};
use tower_once_idempotency::Claim;
use tower_once_step::{Step, StepId, StepLayer};
use tower_once_test_support::postgres::{database_url, Schema};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Refunded {
    id: i64,
}

struct Db {
    schema: Schema,
    store: PostgresStore,
}

impl Db {
    async fn new(connections: u32) -> Self {
        let schema = Schema::create();
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(connections)
            .connect(&database_url())
            .await
            .unwrap();
        let store = PostgresStore::new(pool)
            .table(&format!("{}.steps", schema.name))
            .unwrap();
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

    async fn refunds(&self) -> i64 {
        sqlx::query_scalar(&format!(
            "SELECT count(*) FROM {}.refunds",
            self.schema.name
        ))
        .fetch_one(self.store.pool())
        .await
        .unwrap()
    }
}

fn refund_step(run: &str) -> Step<http::Request<String>> {
    let request = http::Request::post("/refunds")
        .body(String::from("40"))
        .unwrap();
    Step::new(StepId::new(run, 2, "refund"), request)
        .arguments("40")
        .keyed()
}

#[tokio::test]
async fn a_tool_that_completes_the_claim_it_was_handed_has_its_result_replayed() {
    // Crate docs: "done, same arguments | nothing sent | the stored result". The tool finds a
    // `Claim` in its request and does what `Claim` documents for a job's claim on this store:
    // `complete_in(&mut tx)` with its effect, then commit. The step reads the record that
    // committed and says the call is recorded; what it committed is the job layer's empty
    // "done", not the tool's result, and every replay is a codec error.
    let db = Db::new(8).await;
    let (schema, runs) = (db.schema.name.clone(), Arc::new(AtomicUsize::new(0)));
    let counted = Arc::clone(&runs);
    let steps = StepLayer::new(db.store.clone()).layer(tower::service_fn(
        move |req: http::Request<String>| {
            let (schema, runs) = (schema.clone(), Arc::clone(&counted));
            async move {
                runs.fetch_add(1, SeqCst);
                let claim = req
                    .extensions()
                    .get::<Claim<PostgresStore>>()
                    .cloned()
                    .ok_or("no claim")?;
                let mut tx = claim.store().pool().begin().await?;
                let (id,): (i64,) = sqlx::query_as(&format!(
                    "INSERT INTO {schema}.refunds (amount) VALUES (40) RETURNING id"
                ))
                .fetch_one(&mut *tx)
                .await?;
                claim.complete_in(&mut tx).await?;
                tx.commit().await?;
                Ok::<_, BoxError>(Refunded { id })
            }
        },
    ));
    let first = steps.clone().oneshot(refund_step("run-1")).await.unwrap();
    assert!(first.is_recorded(), "{first:?}");
    let again = steps.oneshot(refund_step("run-1")).await;
    assert_eq!((runs.load(SeqCst), db.refunds().await), (1, 1));
    let again = again.expect("the recorded step replays");
    assert_eq!(again.value(), first.value());
}
