//! What a request costs the database on a transactional Postgres store, counted from sqlx's
//! statement events (each is one round trip; the claim's `BEGIN`, sent with the lock in one
//! simple query, is not logged by sqlx and is counted by hand): a fresh key is one commit, a
//! replay one read-only statement. Alone in its test binary: the counting subscriber is global.
#![cfg(feature = "postgres")]

use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::post;
use axum::Router;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Mutex;
use tower_once_idempotency::store::postgres::PostgresStore;
use tower_once_idempotency::{Claim, ClaimError, IdempotencyLayer};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

mod support;

use support::{charge_through, ChargesDb};

static RECORDING: AtomicBool = AtomicBool::new(false);
static STATEMENTS: Mutex<Vec<String>> = Mutex::new(Vec::new());

struct Record;

/// The statement's text: sqlx logs it whole in `db.statement`, or, when it is short, only as
/// its `summary`.
#[derive(Default)]
struct Sql {
    statement: String,
    summary: String,
}

impl Visit for Sql {
    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "db.statement" => self.statement = value.to_owned(),
            "summary" => self.summary = value.to_owned(),
            _ => {}
        }
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.record_str(field, &format!("{value:?}"));
    }
}

impl<S: Subscriber> Layer<S> for Record {
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        if event.metadata().target() == "sqlx::query" && RECORDING.load(SeqCst) {
            let mut sql = Sql::default();
            event.record(&mut sql);
            let text = if sql.statement.trim().is_empty() {
                sql.summary
            } else {
                sql.statement
            };
            STATEMENTS.lock().unwrap().push(text.trim().to_owned());
        }
    }
}

async fn recorded<F: std::future::Future>(work: F) -> (F::Output, Vec<String>) {
    STATEMENTS.lock().unwrap().clear();
    RECORDING.store(true, SeqCst);
    let output = work.await;
    RECORDING.store(false, SeqCst);
    (output, std::mem::take(&mut *STATEMENTS.lock().unwrap()))
}

#[tokio::test(flavor = "current_thread")]
async fn a_fresh_key_is_one_commit_and_a_replay_one_read_only_statement() {
    tracing::subscriber::set_global_default(
        tracing_subscriber::registry().with(
            Record.with_filter(
                tracing_subscriber::filter::Targets::new()
                    .with_target("sqlx::query", tracing::Level::TRACE),
            ),
        ),
    )
    .unwrap();
    let db = ChargesDb::new().await;
    let schema = db.schema.name.clone();
    let handler = move |claim: Claim<PostgresStore>| {
        let schema = schema.clone();
        async move {
            let mut tx = claim.transaction().await?;
            sqlx::query(&format!("INSERT INTO {schema}.charges (amount) VALUES (5)"))
                .execute(&mut *tx)
                .await?;
            claim.commit(tx, (StatusCode::CREATED, "charged")).await
        }
    };
    let handler = move |claim| -> std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Response, ClaimError>> + Send>,
    > { Box::pin(handler(claim)) };
    let router = Router::new().route(
        "/charges",
        post(handler).layer(IdempotencyLayer::with_store(
            db.store.clone().transactional(),
        )),
    );
    // Warm the pool and sqlx's statement cache.
    charge_through(&router, "warm", "{}").await;

    let (fresh, statements) = recorded(charge_through(&router, "k", "{}")).await;
    assert_eq!(fresh.0, StatusCode::CREATED);
    let commits = statements.iter().filter(|s| s.as_str() == "COMMIT").count();
    assert_eq!(commits, 1, "{statements:#?}");
    assert!(
        !statements.iter().any(|s| s.contains("_claim(")),
        "no claim of its own: {statements:#?}"
    );
    // The read of a live record, the charge, the record, the commit.
    assert_eq!(statements.len(), 4, "{statements:#?}");

    let (replay, statements) = recorded(charge_through(&router, "k", "{}")).await;
    assert!(replay.1, "{replay:?}");
    assert_eq!(statements.len(), 1, "{statements:#?}");
    assert!(statements[0].starts_with("SELECT"), "{statements:#?}");
    assert_eq!(db.charges().await, 2);
}
