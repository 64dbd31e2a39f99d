//! A handler completing its claim in its own transaction (idempotency crate docs "Choosing a
//! store": with the Postgres store the record commits with the handler's effects; a stale owner's
//! effect never commits; a duplicate arriving before the commit waits and replays; the layer writes
//! nothing more, so a fresh request costs the claim, the handler's own transaction and one read of
//! the record).
#![cfg(feature = "postgres")]

use axum::body::Body;
use axum::extract::State;
use axum::http::{Request, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use http_body_util::BodyExt;
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tower::ServiceExt;
use tower_once_idempotency::store::postgres::PostgresStore;
use tower_once_idempotency::store::MemoryStore;
use tower_once_idempotency::{Claim, IdempotencyLayer};
use tower_once_test_support::postgres::database_url;

mod support;

use support::ChargesDb as Fixture;

impl Fixture {
    async fn record_state(&self) -> Vec<String> {
        sqlx::query_scalar(&format!("SELECT state FROM {}.idem", self.schema.name))
            .fetch_all(self.pool())
            .await
            .unwrap()
    }
}

/// What a handler does between its effect and its commit.
#[derive(Clone, Copy)]
enum Step {
    /// Store the response, commit.
    Commit,
    /// Block the thread (a GC-like pause: the layer cannot renew the lease) before storing.
    PauseBeforeStoring(Duration),
    /// Store the response, then wait before the commit.
    WaitBeforeCommit(Duration),
    /// Store the response, then lose the connection (its backend killed) before the commit.
    KillBeforeCommit,
}

#[derive(Clone)]
struct App {
    schema: String,
    runs: Arc<AtomicUsize>,
    steps: Arc<Mutex<Vec<Step>>>,
    stored: Arc<tokio::sync::Notify>,
    admin: PgPool,
}

async fn charge(State(app): State<App>, claim: Claim<PostgresStore>, body: String) -> Response {
    let run = app.runs.fetch_add(1, SeqCst) + 1;
    let step = app.steps.lock().unwrap().pop().unwrap_or(Step::Commit);
    let fail = |e: sqlx::Error| (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response();
    let result: Result<Response, Response> = async {
        let mut tx = claim.store().pool().begin().await.map_err(fail)?;
        let amount: i64 = body.trim().parse().unwrap_or(1);
        sqlx::query(&format!(
            "INSERT INTO {}.charges (amount) VALUES ($1)",
            app.schema
        ))
        .bind(amount)
        .execute(&mut *tx)
        .await
        .map_err(fail)?;
        if let Step::PauseBeforeStoring(pause) = step {
            std::thread::sleep(pause);
        }
        let response = claim
            .respond_in(&mut tx, (StatusCode::CREATED, format!("charge {run}")))
            .await
            .map_err(IntoResponse::into_response)?;
        app.stored.notify_one();
        match step {
            Step::WaitBeforeCommit(wait) => tokio::time::sleep(wait).await,
            Step::KillBeforeCommit => {
                let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(fail)?;
                sqlx::query("SELECT pg_terminate_backend($1)")
                    .bind(pid)
                    .execute(&app.admin)
                    .await
                    .map_err(fail)?;
            }
            _ => {}
        }
        tx.commit().await.map_err(fail)?;
        Ok(response)
    }
    .await;
    result.unwrap_or_else(|refused| refused)
}

fn app(fixture: &Fixture, lease: Duration, steps: Vec<Step>) -> (Router, App) {
    let state = App {
        schema: fixture.schema.name.clone(),
        runs: Arc::default(),
        steps: Arc::new(Mutex::new(steps)),
        stored: Arc::default(),
        admin: fixture.pool().clone(),
    };
    let layer = IdempotencyLayer::with_store(fixture.store.clone()).lease(lease);
    let router = Router::new()
        .route("/charges", post(charge))
        .with_state(state.clone())
        .layer(layer);
    (router, state)
}

async fn send(router: &Router, key: &str) -> (StatusCode, bool, String) {
    support::charge_through(router, key, "5").await
}

/// Counts the statements sqlx runs (its `sqlx::query` events), by their first words.
#[derive(Clone, Default)]
struct Statements(Arc<Mutex<Vec<String>>>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Statements {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        if event.metadata().target() != "sqlx::query" {
            return;
        }
        struct Summary(Option<String>);
        impl tracing::field::Visit for Summary {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "db.statement" || (field.name() == "summary" && self.0.is_none())
                {
                    self.0 = Some(format!("{value:?}"));
                }
            }
            fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
                if field.name() == "db.statement" || (field.name() == "summary" && self.0.is_none())
                {
                    self.0 = Some(value.to_owned());
                }
            }
        }
        let mut summary = Summary(None);
        event.record(&mut summary);
        self.0.lock().unwrap().push(summary.0.unwrap_or_default());
    }
}

impl Statements {
    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

fn on_records(statements: &[String], what: &str) -> usize {
    statements
        .iter()
        .filter(|s| s.contains(".idem") && s.contains(what))
        .count()
}

#[tokio::test(flavor = "current_thread")]
async fn the_record_commits_in_the_handlers_transaction_and_the_layer_only_reads_that_it_did() {
    use tracing_subscriber::layer::SubscriberExt;
    let statements = Statements::default();
    let _guard = tracing::subscriber::set_default(
        tracing_subscriber::registry()
            .with(statements.clone())
            .with(
                tracing_subscriber::filter::Targets::new()
                    .with_target("sqlx::query", tracing::Level::TRACE),
            ),
    );
    let fixture = Fixture::new().await;
    let (router, app) = app(&fixture, Duration::from_secs(10), vec![]);
    statements.take();

    let (status, replayed, body) = send(&router, "pay-1").await;
    assert_eq!(
        (status, replayed, body.as_str()),
        (StatusCode::CREATED, false, "charge 1")
    );
    let fresh = statements.take();
    assert_eq!(on_records(&fresh, "_claim("), 1, "{fresh:#?}");
    assert_eq!(
        on_records(&fresh, "UPDATE"),
        1,
        "one completion, in the transaction: {fresh:#?}"
    );
    // The claim, then the handler's transaction: its INSERT, the completion, its COMMIT
    // (logged by sqlx without a statement text). After it, the layer only reads whether the
    // record committed (it checks the record, not a mark on the response), and writes nothing.
    assert_eq!(fresh.len(), 5, "{fresh:#?}");
    assert!(
        fresh[0].contains("_claim(") && fresh[1].contains("INSERT INTO"),
        "{fresh:#?}"
    );
    assert!(fresh[2].contains(".idem SET state"), "{fresh:#?}");
    assert!(!fresh[3].contains(".idem"), "{fresh:#?}");
    assert!(
        fresh[4].trim_start().starts_with("SELECT") && fresh[4].contains(".idem WHERE key"),
        "{fresh:#?}"
    );
    let (status, replayed, body) = send(&router, "pay-1").await;
    assert_eq!(
        (status, replayed, body.as_str()),
        (StatusCode::CREATED, true, "charge 1")
    );
    let replay = statements.take();
    assert_eq!(replay.len(), 1, "a replay is one statement: {replay:#?}");
    assert_eq!(app.runs.load(SeqCst), 1);
    assert_eq!(fixture.charges().await, 1);
    assert_eq!(fixture.record_state().await, ["completed"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_owner_paused_past_its_lease_never_commits_its_effect() {
    let fixture = Fixture::new().await;
    let lease = Duration::from_millis(300);
    // The first request pauses its thread for three leases after its effect; the retry runs
    // normally (steps are popped from the end).
    let (router, app) = app(
        &fixture,
        lease,
        vec![Step::Commit, Step::PauseBeforeStoring(lease * 3)],
    );
    let first = tokio::spawn({
        let router = router.clone();
        async move { send(&router, "pay-2").await }
    });
    // The retry, once the paused owner's lease has run out.
    tokio::time::sleep(lease * 2).await;
    let (status, replayed, body) = send(&router, "pay-2").await;
    assert_eq!(
        (status, replayed, body.as_str()),
        (StatusCode::CREATED, false, "charge 2")
    );
    let (status, _, body) = first.await.unwrap();
    assert_eq!(
        status,
        StatusCode::CONFLICT,
        "the stale owner's claim is lost: {body}"
    );
    assert!(body.contains("claim lost"), "{body}");
    assert_eq!(app.runs.load(SeqCst), 2, "both handlers ran");
    assert_eq!(
        fixture.charges().await,
        1,
        "only the retry's effect committed"
    );
    let (status, replayed, body) = send(&router, "pay-2").await;
    assert_eq!(
        (status, replayed, body.as_str()),
        (StatusCode::CREATED, true, "charge 2")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_arriving_before_the_commit_is_told_in_progress_and_its_retry_replays() {
    let fixture = Fixture::new().await;
    let (router, app) = app(
        &fixture,
        Duration::from_secs(10),
        vec![Step::WaitBeforeCommit(Duration::from_millis(400))],
    );
    let first = tokio::spawn({
        let router = router.clone();
        async move { send(&router, "pay-3").await }
    });
    app.stored.notified().await;
    // Stored but not committed: the record still reads as in progress, without a wait.
    let (status, replayed, _) = send(&router, "pay-3").await;
    assert_eq!((status, replayed), (StatusCode::CONFLICT, false));
    assert_eq!(first.await.unwrap().0, StatusCode::CREATED);
    let (status, replayed, body) = send(&router, "pay-3").await;
    assert_eq!(
        (status, replayed, body.as_str()),
        (StatusCode::CREATED, true, "charge 1")
    );
    assert_eq!(app.runs.load(SeqCst), 1);
    assert_eq!(fixture.charges().await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_lost_before_the_commit_leaves_neither_effect_nor_record() {
    let fixture = Fixture::new().await;
    let (router, app) = app(
        &fixture,
        Duration::from_secs(10),
        vec![Step::Commit, Step::KillBeforeCommit],
    );
    let (status, _, _) = send(&router, "pay-4").await;
    assert!(status.is_server_error(), "{status}");
    assert_eq!(
        fixture.charges().await,
        0,
        "the effect rolled back with the record"
    );
    // The layer released the claim (fenced): the retry runs, once.
    let (status, replayed, body) = send(&router, "pay-4").await;
    assert_eq!(
        (status, replayed, body.as_str()),
        (StatusCode::CREATED, false, "charge 2")
    );
    let (_, replayed, _) = send(&router, "pay-4").await;
    assert!(replayed);
    assert_eq!(app.runs.load(SeqCst), 2);
    assert_eq!(fixture.charges().await, 1);
}

#[tokio::test]
async fn the_extractor_refuses_clearly_without_a_claim_and_is_optional() {
    async fn needs(_: Claim<PostgresStore>) -> &'static str {
        "ran"
    }
    async fn may(claim: Option<Claim<PostgresStore>>) -> String {
        format!("claim: {}", claim.is_some())
    }
    let router = Router::new()
        .route("/needs", post(needs))
        .route("/may", post(may))
        .layer(IdempotencyLayer::with_store(MemoryStore::new()));
    let response = router
        .clone()
        .oneshot(
            Request::post("/needs")
                .header("idempotency-key", "k")
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert!(String::from_utf8_lossy(&body).contains("no idempotency claim"));
    let response = router
        .oneshot(
            Request::post("/may")
                .header("idempotency-key", "k")
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, "claim: false");
}

/// The Postgres store with its completion failing, as an outage right after the handler would.
#[derive(Clone)]
struct CompletionFails(PostgresStore);

impl tower_once_idempotency::store::IdempotencyStore for CompletionFails {
    type ClaimFuture =
        <PostgresStore as tower_once_idempotency::store::IdempotencyStore>::ClaimFuture;
    type CompleteFuture =
        std::future::Ready<Result<bool, tower_once_idempotency::store::StoreError>>;
    type ReleaseFuture =
        <PostgresStore as tower_once_idempotency::store::IdempotencyStore>::ReleaseFuture;
    type ExtendFuture =
        <PostgresStore as tower_once_idempotency::store::IdempotencyStore>::ExtendFuture;

    fn claim(
        &self,
        key: tower_once_idempotency::store::StoreKey,
        token: tower_once_idempotency::ClaimToken,
        fingerprint: tower_once_idempotency::fingerprint::Fingerprint,
        lease: Duration,
    ) -> Self::ClaimFuture {
        self.0.claim(key, token, fingerprint, lease)
    }

    fn complete(
        &self,
        _: tower_once_idempotency::store::StoreKey,
        _: tower_once_idempotency::ClaimToken,
        _: tower_once_idempotency::store::Completion,
        _: Duration,
    ) -> Self::CompleteFuture {
        let outage = std::io::Error::other("connection reset");
        std::future::ready(Err(tower_once_idempotency::store::StoreError::unavailable(
            outage,
        )))
    }

    fn release(
        &self,
        key: tower_once_idempotency::store::StoreKey,
        token: tower_once_idempotency::ClaimToken,
    ) -> Self::ReleaseFuture {
        self.0.release(key, token)
    }

    fn extend(
        &self,
        key: tower_once_idempotency::store::StoreKey,
        token: tower_once_idempotency::ClaimToken,
        lease: Duration,
    ) -> Self::ExtendFuture {
        self.0.extend(key, token, lease)
    }
}

#[tokio::test]
async fn for_comparison_when_the_layer_writes_the_record_an_outage_after_the_handler_charges_twice()
{
    // The window the in-transaction completion closes: the handler commits its charge, the
    // layer's own write of the record fails, and once the lease ends the retry runs again.
    let fixture = Fixture::new().await;
    let schema = fixture.schema.name.clone();
    let pool = fixture.pool().clone();
    let charge = move || {
        let (schema, pool) = (schema.clone(), pool.clone());
        async move {
            sqlx::query(&format!("INSERT INTO {schema}.charges (amount) VALUES (5)"))
                .execute(&pool)
                .await
                .unwrap();
            (StatusCode::CREATED, "charged")
        }
    };
    let lease = Duration::from_millis(200);
    let router = Router::new()
        .route("/charges", post(charge))
        .layer(IdempotencyLayer::with_store(CompletionFails(fixture.store.clone())).lease(lease));
    assert_eq!(send(&router, "pay-5").await.0, StatusCode::CREATED);
    tokio::time::sleep(lease * 2).await;
    assert_eq!(send(&router, "pay-5").await.0, StatusCode::CREATED);
    assert_eq!(
        fixture.charges().await,
        2,
        "the documented window of a separate write"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicates_refused_during_a_slow_commit_do_not_take_the_pool_from_other_keys() {
    let fixture = Fixture::new().await;
    // A small pool and a short statement timeout: the handler's transaction holds one
    // connection for its whole slow commit, which leaves two.
    let pool = PgPoolOptions::new()
        .max_connections(3)
        .connect(&database_url())
        .await
        .unwrap();
    let store = PostgresStore::new(pool)
        .table(fixture.store.table_name())
        .unwrap()
        .command_timeout(Duration::from_millis(300));
    let state = App {
        schema: fixture.schema.name.clone(),
        runs: Arc::default(),
        // The slow request waits 3 s between storing and committing; the other commits.
        steps: Arc::new(Mutex::new(vec![
            Step::Commit,
            Step::WaitBeforeCommit(Duration::from_secs(3)),
        ])),
        stored: Arc::default(),
        admin: fixture.pool().clone(),
    };
    let router = Router::new()
        .route("/charges", post(charge))
        .with_state(state.clone())
        .layer(IdempotencyLayer::with_store(store).lease(Duration::from_secs(10)));
    let slow = tokio::spawn({
        let router = router.clone();
        async move { send(&router, "slow").await }
    });
    state.stored.notified().await;

    // Two duplicates arrive while the row is locked: each is told "in progress" at once (the
    // claim reads the record without waiting for the lock).
    let (a, b) = tokio::join!(send(&router, "slow"), send(&router, "slow"));
    assert_eq!((a.0, b.0), (StatusCode::CONFLICT, StatusCode::CONFLICT));

    // Another key, while the slow one is still committing: the refused duplicates must not
    // still hold their connections.
    let (status, replayed, body) = send(&router, "other").await;
    assert_eq!(
        (status, replayed),
        (StatusCode::CREATED, false),
        "a fresh key is served during another key's slow commit: {body}"
    );
    assert_eq!(
        state.runs.load(SeqCst),
        2,
        "the slow handler and the other key's"
    );
    assert_eq!(slow.await.unwrap().0, StatusCode::CREATED);
    assert_eq!(fixture.charges().await, 2, "one charge per key");
}
