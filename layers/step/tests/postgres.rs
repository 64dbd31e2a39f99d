//! A tool whose effect is in Postgres commits the step's result in the same transaction (crate
//! docs of `tower_once_step::postgres`): one commit for the effect and the result; an error
//! before the commit leaves neither and the step runs again at once; a tool frozen past its
//! lease is ended by Postgres and never commits after another owner took the step over; an
//! unkeyed step that could not be made safe on a transactional store is refused.
#![cfg(feature = "postgres")]

use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;
use tower::{BoxError, Layer, Service, ServiceExt};
use tower_once_idempotency::store::postgres::{sqlx, PostgresStore};
use tower_once_idempotency::Claim;
use tower_once_step::{OnUnknown, Step, StepId, StepLayer};
use tower_once_test_support::postgres::{database_url, Schema};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Refunded {
    id: i64,
}

/// What the tool does after writing its refund on the step's transaction.
#[derive(Debug, Clone, Copy)]
enum Then {
    Commit,
    Fail,
    /// Sleeps this long holding the transaction idle, then commits.
    Freeze(Duration),
}

struct Db {
    schema: Schema,
    store: PostgresStore,
}

impl Db {
    async fn new() -> Self {
        let schema = Schema::create();
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(8)
            .connect(&database_url())
            .await
            .unwrap();
        let store = PostgresStore::new(pool)
            .table(&format!("{}.steps", schema.name))
            .unwrap()
            .transactional();
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

/// A refund tool: its effect and the step's result in the step's transaction.
fn tool(
    schema: String,
    plans: Arc<std::sync::Mutex<Vec<Then>>>,
    runs: Arc<AtomicUsize>,
) -> impl Service<http::Request<String>, Response = Refunded, Error = BoxError, Future = impl Send>
       + Clone
       + Send {
    tower::service_fn(move |req: http::Request<String>| {
        let (schema, plans, runs) = (schema.clone(), Arc::clone(&plans), Arc::clone(&runs));
        async move {
            runs.fetch_add(1, SeqCst);
            let then = plans.lock().unwrap().pop().unwrap_or(Then::Commit);
            let claim = req
                .extensions()
                .get::<Claim<PostgresStore>>()
                .cloned()
                .ok_or("no claim")?;
            let mut tx = claim.transaction().await?;
            let (id,): (i64,) = sqlx::query_as(&format!(
                "INSERT INTO {schema}.refunds (amount) VALUES (40) RETURNING id"
            ))
            .fetch_one(&mut *tx)
            .await?;
            let refunded = Refunded { id };
            match then {
                Then::Commit => {}
                Then::Fail => return Err("the payment provider said no".into()),
                Then::Freeze(pause) => tokio::time::sleep(pause).await,
            }
            tower_once_step::postgres::commit(&claim, tx, &refunded).await?;
            Ok(refunded)
        }
    })
}

fn refund_step(run: &str) -> Step<http::Request<String>> {
    let request = http::Request::post("/refunds")
        .body(String::from("40"))
        .unwrap();
    Step::new(StepId::new(run, 2, "refund"), request)
        .arguments("40")
        .on_unknown(OnUnknown::RunAgain)
}

#[tokio::test]
async fn the_effect_and_the_result_commit_together_and_the_step_replays() {
    let db = Db::new().await;
    let runs = Arc::new(AtomicUsize::new(0));
    let plans = Arc::new(std::sync::Mutex::new(Vec::new()));
    let steps = StepLayer::new(db.store.clone()).layer(tool(
        db.schema.name.clone(),
        plans,
        Arc::clone(&runs),
    ));
    let first = steps.clone().oneshot(refund_step("run-1")).await.unwrap();
    assert!(first.is_recorded() && !first.is_replayed());
    let again = steps.oneshot(refund_step("run-1")).await.unwrap();
    assert!(again.is_replayed());
    assert_eq!(again.value(), first.value(), "the committed result replays");
    assert_eq!((runs.load(SeqCst), db.refunds().await), (1, 1));
}

#[tokio::test]
async fn a_tool_that_fails_before_its_commit_leaves_nothing_and_the_step_runs_again_at_once() {
    let db = Db::new().await;
    let runs = Arc::new(AtomicUsize::new(0));
    let plans = Arc::new(std::sync::Mutex::new(vec![Then::Fail]));
    let steps = StepLayer::new(db.store.clone())
        .lease(Duration::from_secs(30))
        .layer(tool(db.schema.name.clone(), plans, Arc::clone(&runs)));
    let failed = steps
        .clone()
        .oneshot(refund_step("run-2"))
        .await
        .unwrap_err();
    assert!(failed.is_inner(), "{failed}");
    assert_eq!(
        db.refunds().await,
        0,
        "the refund rolled back with the step"
    );
    // No lease to wait out (30 s): the retry runs now and refunds once.
    let retried = tokio::time::timeout(Duration::from_secs(5), steps.oneshot(refund_step("run-2")))
        .await
        .expect("the step is free at once")
        .unwrap();
    assert!(retried.is_recorded());
    assert_eq!((runs.load(SeqCst), db.refunds().await), (2, 1));
}

#[tokio::test]
async fn a_tool_frozen_past_its_lease_never_commits_after_another_owner_took_over() {
    let db = Db::new().await;
    let runs = Arc::new(AtomicUsize::new(0));
    let lease = Duration::from_millis(600);
    // The first run holds its transaction idle for five leases: Postgres ends its session.
    let plans = Arc::new(std::sync::Mutex::new(vec![Then::Freeze(lease * 5)]));
    let steps = StepLayer::new(db.store.clone()).lease(lease).layer(tool(
        db.schema.name.clone(),
        plans,
        Arc::clone(&runs),
    ));
    let frozen = tokio::spawn(steps.clone().oneshot(refund_step("run-3")));
    while runs.load(SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // A second owner (another replica, after the first froze): it waits for the step and
    // takes it over once the frozen owner's transaction is gone.
    let second = tokio::time::timeout(
        Duration::from_secs(20),
        steps.clone().oneshot(refund_step("run-3")),
    )
    .await
    .expect("the second owner settles within the bound")
    .unwrap();
    assert!(second.is_recorded() || second.is_replayed());
    let first = frozen.await.unwrap();
    assert!(
        first.as_ref().map_or(true, |out| !out.is_recorded()),
        "the frozen owner cannot commit: {first:?}"
    );
    assert_eq!(db.refunds().await, 1, "one refund, whoever made it");
    let again = steps.oneshot(refund_step("run-3")).await.unwrap();
    assert!(again.is_replayed());
    assert_eq!(again.value(), second.value());
}

#[tokio::test]
async fn an_unkeyed_post_that_may_not_be_sent_twice_is_refused_on_a_transactional_store() {
    let db = Db::new().await;
    let runs = Arc::new(AtomicUsize::new(0));
    let plans = Arc::new(std::sync::Mutex::new(Vec::new()));
    let steps = StepLayer::new(db.store.clone()).layer(tool(
        db.schema.name.clone(),
        plans,
        Arc::clone(&runs),
    ));
    let request = http::Request::post("/notes").body(String::new()).unwrap();
    let step = Step::new(StepId::new("run-4", 3, "note"), request);
    let refused = steps.oneshot(step).await.unwrap_err();
    assert!(refused.is_misused(), "{refused}");
    assert_eq!(runs.load(SeqCst), 0, "nothing sent");
}
