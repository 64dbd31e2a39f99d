//! What a handler's own completion may store (`Claim::respond_in` and `Claim::complete_in`, their
//! rustdoc, and the crate docs' "Records that commit with the effect"): a response written in
//! the handler's transaction follows the layer's `store_when` rules; a claim error is never a
//! key's answer; a second completion is refused as such, never reported as lost; and the layer
//! checks the record, not the response, before it writes nothing more.
#![cfg(feature = "postgres")]

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use sqlx::Acquire;
use std::collections::VecDeque;
use std::error::Error as _;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tower_once_idempotency::predicate::StorePredicate;
use tower_once_idempotency::store::postgres::PostgresStore;
use tower_once_idempotency::{Claim, ClaimError, IdempotencyLayer};

mod support;

/// What the handler does on one run (runs take the plans in order; then [`Plan::Answer`] 201).
#[derive(Clone, Copy, Debug)]
enum Plan {
    /// Charge (only for a 2xx), answer `status` through `respond_in`, commit.
    Answer(StatusCode),
    /// Charge in a `SERIALIZABLE` transaction, wait (the layer renews the lease meanwhile),
    /// answer through `respond_in`, commit.
    SerializableSlow(Duration),
    /// Charge, answer through `respond_in`, then complete again (`respond_in`, `complete_in`)
    /// and return the second completion's error.
    CompleteTwice,
    /// Charge, answer through `respond_in` inside a savepoint that is rolled back, commit.
    SavepointRolledBack,
    /// Charge, answer through `respond_in`, roll the transaction back, return the response.
    RolledBack,
    /// Charge, answer through `respond_in`, then panic before the commit (the transaction is
    /// dropped by the unwind).
    PanicBeforeCommit,
    /// Charge, answer `201` through `respond_in`, commit, then return a `503` of its own.
    CommitThenAnswer503,
    /// Charge, answer `200` with a body of this many bytes through `respond_in`, commit.
    Big(usize),
    /// A gRPC answer: HTTP `200`, `application/grpc`, a body, and `grpc-status: <code>` in
    /// the trailers, through `respond_in`; charge only for code `0`; commit.
    Grpc(u8),
    /// Charge, answer through `respond_in`, say so on `App::entered`, wait for `App::gate`,
    /// roll the transaction back, return the response.
    HeldThenRolledBack,
    /// At the default isolation (`READ COMMITTED`): charge, wait `before`, answer through
    /// `respond_in`, wait `after` (the record's row locked), commit.
    Slow { before: Duration, after: Duration },
}

/// A body of one data frame, then trailers.
struct WithTrailers {
    data: Option<bytes::Bytes>,
    trailers: Option<http::HeaderMap>,
}

impl http_body::Body for WithTrailers {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        if let Some(data) = self.data.take() {
            return std::task::Poll::Ready(Some(Ok(http_body::Frame::data(data))));
        }
        std::task::Poll::Ready(
            self.trailers
                .take()
                .map(|t| Ok(http_body::Frame::trailers(t))),
        )
    }
}

/// A `ClaimError` the handler saw, as its queries answered.
#[derive(Debug)]
struct Refusal {
    lost: bool,
    already_completed: bool,
    store: bool,
    /// Postgres refused with SQLSTATE 40001 (a serialization failure) somewhere in its causes.
    serialization: bool,
    message: String,
}

impl Refusal {
    fn of(error: &ClaimError) -> Self {
        let mut serialization = false;
        let mut cause: Option<&(dyn std::error::Error + 'static)> = error.source();
        while let Some(e) = cause {
            if let Some(sqlx::Error::Database(db)) = e.downcast_ref::<sqlx::Error>() {
                serialization |= db.code().as_deref() == Some("40001");
            }
            cause = e.source();
        }
        Self {
            lost: error.is_lost(),
            already_completed: error.is_already_completed(),
            store: error.is_store(),
            serialization,
            message: error.to_string(),
        }
    }
}

#[derive(Clone)]
struct App {
    schema: String,
    runs: Arc<AtomicUsize>,
    plans: Arc<Mutex<VecDeque<Plan>>>,
    refusals: Arc<Mutex<Vec<Refusal>>>,
    /// Told by [`Plan::HeldThenRolledBack`] once its record is written.
    entered: Arc<tokio::sync::Notify>,
    /// What [`Plan::HeldThenRolledBack`] waits for before its rollback.
    gate: Arc<tokio::sync::Notify>,
}

impl App {
    fn runs(&self) -> usize {
        self.runs.load(SeqCst)
    }

    fn refusals(&self) -> Vec<Refusal> {
        std::mem::take(&mut *self.refusals.lock().unwrap())
    }

    fn refused(&self, error: ClaimError) -> Response {
        self.refusals.lock().unwrap().push(Refusal::of(&error));
        error.into_response()
    }
}

async fn charge(State(app): State<App>, claim: Claim<PostgresStore>) -> Response {
    let run = app.runs.fetch_add(1, SeqCst) + 1;
    let plan = app
        .plans
        .lock()
        .unwrap()
        .pop_front()
        .unwrap_or(Plan::Answer(StatusCode::CREATED));
    handle(&app, &claim, run, plan)
        .await
        .unwrap_or_else(|refused| refused)
}

async fn handle(
    app: &App,
    claim: &Claim<PostgresStore>,
    run: usize,
    plan: Plan,
) -> Result<Response, Response> {
    let fail = |e: sqlx::Error| (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response();
    let answer = format!("charge {run}");
    let mut tx = claim.store().pool().begin().await.map_err(fail)?;
    if let Plan::SerializableSlow(_) = plan {
        sqlx::query("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE")
            .execute(&mut *tx)
            .await
            .map_err(fail)?;
    }
    let status = match plan {
        Plan::Answer(status) => status,
        Plan::Big(_) | Plan::Grpc(_) => StatusCode::OK,
        _ => StatusCode::CREATED,
    };
    if status.is_success() && !matches!(plan, Plan::Grpc(code) if code != 0) {
        // The transaction's first statement: its snapshot, at `SERIALIZABLE`.
        sqlx::query(&format!(
            "INSERT INTO {}.charges (amount) VALUES (5)",
            app.schema
        ))
        .execute(&mut *tx)
        .await
        .map_err(fail)?;
    }
    match plan {
        Plan::Answer(_) => {}
        Plan::SerializableSlow(wait) => tokio::time::sleep(wait).await,
        Plan::Big(len) => {
            let response = claim
                .respond_in(&mut tx, (status, vec![b'x'; len]))
                .await
                .map_err(|e| app.refused(e))?;
            tx.commit().await.map_err(fail)?;
            return Ok(response);
        }
        Plan::Grpc(code) => {
            let mut trailers = http::HeaderMap::new();
            trailers.insert("grpc-status", code.to_string().parse().unwrap());
            let grpc = http::Response::builder()
                .status(StatusCode::OK)
                .header("content-type", "application/grpc")
                .body(axum::body::Body::new(WithTrailers {
                    data: Some(bytes::Bytes::from(answer)),
                    trailers: Some(trailers),
                }))
                .unwrap();
            let response = claim
                .respond_in(&mut tx, grpc)
                .await
                .map_err(|e| app.refused(e))?;
            tx.commit().await.map_err(fail)?;
            return Ok(response);
        }
        Plan::HeldThenRolledBack => {
            let response = claim
                .respond_in(&mut tx, (status, answer))
                .await
                .map_err(|e| app.refused(e))?;
            app.entered.notify_one();
            app.gate.notified().await;
            tx.rollback().await.map_err(fail)?;
            return Ok(response);
        }
        Plan::Slow { before, after } => {
            tokio::time::sleep(before).await;
            let response = claim
                .respond_in(&mut tx, (status, answer))
                .await
                .map_err(|e| app.refused(e))?;
            tokio::time::sleep(after).await;
            tx.commit().await.map_err(fail)?;
            return Ok(response);
        }
        Plan::CompleteTwice => {
            claim
                .respond_in(&mut tx, (status, answer.clone()))
                .await
                .map_err(|e| app.refused(e))?;
            let again = claim.respond_in(&mut tx, (status, answer.clone())).await;
            if let Err(error) = claim.complete_in(&mut tx).await {
                app.refused(error);
            }
            return Err(match again {
                Ok(_) => (StatusCode::IM_A_TEAPOT, "completed twice").into_response(),
                Err(error) => app.refused(error),
            });
        }
        Plan::SavepointRolledBack => {
            let mut savepoint = tx.begin().await.map_err(fail)?;
            let response = claim
                .respond_in(&mut savepoint, (status, answer))
                .await
                .map_err(|e| app.refused(e))?;
            savepoint.rollback().await.map_err(fail)?;
            tx.commit().await.map_err(fail)?;
            return Ok(response);
        }
        Plan::CommitThenAnswer503 => {
            let _stored = claim
                .respond_in(&mut tx, (status, answer))
                .await
                .map_err(|e| app.refused(e))?;
            tx.commit().await.map_err(fail)?;
            return Ok((StatusCode::SERVICE_UNAVAILABLE, "try again").into_response());
        }
        Plan::PanicBeforeCommit => {
            let _response = claim
                .respond_in(&mut tx, (status, answer))
                .await
                .map_err(|e| app.refused(e))?;
            panic!("handler bug after respond_in, before the commit");
        }
        Plan::RolledBack => {
            let response = claim
                .respond_in(&mut tx, (status, answer))
                .await
                .map_err(|e| app.refused(e))?;
            tx.rollback().await.map_err(fail)?;
            return Ok(response);
        }
    }
    let response = claim
        .respond_in(&mut tx, (status, answer))
        .await
        .map_err(|e| app.refused(e))?;
    tx.commit().await.map_err(fail)?;
    Ok(response)
}

use support::ChargesDb as Fixture;

impl Fixture {
    fn app<P>(&self, lease: Duration, predicate: P, plans: Vec<Plan>) -> (Router, App)
    where
        P: StorePredicate + Clone + Send + Sync + 'static,
    {
        self.limited_app(lease, predicate, plans, 1 << 20)
    }

    /// [`app`](Self::app) with the layer's `response_limit` set to `limit` bytes.
    fn limited_app<P>(
        &self,
        lease: Duration,
        predicate: P,
        plans: Vec<Plan>,
        limit: usize,
    ) -> (Router, App)
    where
        P: StorePredicate + Clone + Send + Sync + 'static,
    {
        let state = App {
            schema: self.schema.name.clone(),
            runs: Arc::default(),
            plans: Arc::new(Mutex::new(plans.into())),
            refusals: Arc::default(),
            entered: Arc::default(),
            gate: Arc::default(),
        };
        let layer = IdempotencyLayer::with_store(self.store.clone())
            .lease(lease)
            .response_limit(limit)
            .store_when(predicate);
        let router = Router::new()
            .route("/charges", post(charge))
            .with_state(state.clone())
            .layer(layer);
        (router, state)
    }

    fn default_app(&self, lease: Duration, plans: Vec<Plan>) -> (Router, App) {
        self.app(
            lease,
            tower_once_idempotency::predicate::DefaultPredicate,
            plans,
        )
    }
}

/// Sends `body` with `key`: the status, whether it was a replay, the body.
async fn send(router: &Router, key: &str, body: &'static str) -> (StatusCode, bool, String) {
    support::charge_through(router, key, body).await
}

/// Sends `key` again and asserts the stored answer is replayed: `status` and `body`, without
/// running the handler.
async fn assert_replays(router: &Router, key: &str, status: StatusCode, body: &str) {
    let answer = send(router, key, "5").await;
    assert_eq!(
        (answer.0, answer.1, answer.2.as_str()),
        (status, true, body),
        "a replay of {key}"
    );
}

const LEASE: Duration = Duration::from_secs(10);

#[tokio::test]
async fn a_503_sent_through_respond_in_is_not_stored_and_the_retry_runs_the_handler_again() {
    let fixture = Fixture::new().await;
    let (router, app) =
        fixture.default_app(LEASE, vec![Plan::Answer(StatusCode::SERVICE_UNAVAILABLE)]);
    let (status, replayed, _) = send(&router, "pay-503", "5").await;
    assert_eq!((status, replayed), (StatusCode::SERVICE_UNAVAILABLE, false));
    assert_eq!(fixture.charges().await, 0);

    let (status, replayed, body) = send(&router, "pay-503", "5").await;
    assert_eq!(
        (status, replayed, body.as_str()),
        (StatusCode::CREATED, false, "charge 2"),
        "the retry ran the handler"
    );
    assert_replays(&router, "pay-503", StatusCode::CREATED, "charge 2").await;
    assert_eq!(app.runs(), 2);
    assert_eq!(fixture.charges().await, 1);
    assert!(app.refusals().is_empty());
}

#[tokio::test]
async fn a_422_sent_through_respond_in_is_not_stored_and_the_fixed_resend_runs() {
    let fixture = Fixture::new().await;
    let (router, app) =
        fixture.default_app(LEASE, vec![Plan::Answer(StatusCode::UNPROCESSABLE_ENTITY)]);
    let (status, _, _) = send(&router, "pay-422", "five").await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);

    // The client fixes its request and resends it with the same key.
    let (status, replayed, body) = send(&router, "pay-422", "5").await;
    assert_eq!(
        (status, replayed, body.as_str()),
        (StatusCode::CREATED, false, "charge 2"),
        "the fixed resend ran the handler: {body}"
    );
    assert_eq!(app.runs(), 2);
    assert_eq!(fixture.charges().await, 1);
}

#[tokio::test]
async fn respond_in_follows_a_replaced_store_predicate() {
    let fixture = Fixture::new().await;
    let only_success = |parts: &http::response::Parts| parts.status.is_success();
    let (router, app) = fixture.app(
        LEASE,
        only_success,
        vec![Plan::Answer(StatusCode::NOT_FOUND)],
    );
    let (status, _, _) = send(&router, "pay-404", "5").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, replayed, _) = send(&router, "pay-404", "5").await;
    assert_eq!(
        (status, replayed),
        (StatusCode::CREATED, false),
        "the predicate stores successes only: the 404 was not kept"
    );
    let (_, replayed, _) = send(&router, "pay-404", "5").await;
    assert!(replayed, "the success is");
    assert_eq!(app.runs(), 2);
    assert_eq!(fixture.charges().await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_serializable_handler_slower_than_its_lease_gets_a_serialization_error_and_the_retry_charges_once(
) {
    let fixture = Fixture::new().await;
    let lease = Duration::from_millis(300);
    // Renewed every 100 ms while the handler waits: the row it completes changed after its
    // snapshot, and the version in that snapshot has expired.
    let (router, app) = fixture.default_app(lease, vec![Plan::SerializableSlow(lease * 3)]);
    let (status, _, body) = send(&router, "pay-ser", "5").await;
    let refusals = app.refusals();
    assert_eq!(refusals.len(), 1, "{refusals:?}");
    let refusal = &refusals[0];
    assert!(
        !refusal.lost,
        "the claim is still this request's: {refusal:?}"
    );
    assert!(
        refusal.store && refusal.serialization,
        "a serialization failure, as documented: {refusal:?}"
    );
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(fixture.charges().await, 0, "the transaction rolled back");

    // The key was not burned: the retry runs and charges, once.
    let (status, replayed, body) = send(&router, "pay-ser", "5").await;
    assert_eq!(
        (status, replayed, body.as_str()),
        (StatusCode::CREATED, false, "charge 2")
    );
    let (status, replayed, _) = send(&router, "pay-ser", "5").await;
    assert_eq!((status, replayed), (StatusCode::CREATED, true));
    assert_eq!(app.runs(), 2);
    assert_eq!(fixture.charges().await, 1);
}

#[tokio::test]
async fn a_second_completion_in_one_handler_is_refused_as_already_completed_and_the_key_stays_free()
{
    let fixture = Fixture::new().await;
    let (router, app) = fixture.default_app(LEASE, vec![Plan::CompleteTwice]);
    let (status, replayed, body) = send(&router, "pay-twice", "5").await;
    assert!(!replayed);
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{body}");
    let refusals = app.refusals();
    assert_eq!(
        refusals.len(),
        2,
        "respond_in and complete_in: {refusals:?}"
    );
    for refusal in &refusals {
        assert!(
            !refusal.lost,
            "the claim is still this request's: {refusal:?}"
        );
        assert!(
            refusal.already_completed && refusal.message.contains("already completed"),
            "{refusal:?}"
        );
    }
    assert_eq!(fixture.charges().await, 0, "the handler rolled back");

    let (status, replayed, body) = send(&router, "pay-twice", "5").await;
    assert_eq!(
        (status, replayed, body.as_str()),
        (StatusCode::CREATED, false, "charge 2")
    );
    assert_eq!(app.runs(), 2);
    assert_eq!(fixture.charges().await, 1);
}

#[tokio::test]
async fn a_claim_error_is_never_stored_even_by_a_predicate_that_stores_every_response() {
    let fixture = Fixture::new().await;
    let (router, app) = fixture.app(
        LEASE,
        |_: &http::response::Parts| true,
        vec![Plan::CompleteTwice],
    );
    let (status, _, _) = send(&router, "pay-any", "5").await;
    assert!(
        status.is_client_error() || status.is_server_error(),
        "{status}"
    );
    assert_eq!(app.refusals().len(), 2);

    let (status, replayed, body) = send(&router, "pay-any", "5").await;
    assert_eq!(
        (status, replayed, body.as_str()),
        (StatusCode::CREATED, false, "charge 2"),
        "the claim error was not the key's answer"
    );
    assert_eq!(app.runs(), 2);
    assert_eq!(fixture.charges().await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_rolled_back_with_its_savepoint_is_stored_by_the_layer_and_the_retry_replays() {
    let fixture = Fixture::new().await;
    let lease = Duration::from_millis(300);
    let (router, app) = fixture.default_app(lease, vec![Plan::SavepointRolledBack]);
    let (status, replayed, body) = send(&router, "pay-sp", "5").await;
    assert_eq!(
        (status, replayed, body.as_str()),
        (StatusCode::CREATED, false, "charge 1")
    );
    assert_eq!(fixture.charges().await, 1, "the charge committed");

    // A retry once the lease would have run out: the record is there, the charge is not repeated.
    tokio::time::sleep(lease * 2).await;
    assert_replays(&router, "pay-sp", StatusCode::CREATED, "charge 1").await;
    assert_eq!(app.runs(), 1);
    assert_eq!(fixture.charges().await, 1);
}

#[tokio::test]
async fn a_response_whose_transaction_rolled_back_is_not_stored_and_the_retry_runs_at_once() {
    let fixture = Fixture::new().await;
    let (router, app) = fixture.default_app(LEASE, vec![Plan::RolledBack]);
    // The handler returns what `respond_in` gave it, though its transaction rolled back.
    let (status, _, _) = send(&router, "pay-rb", "5").await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(fixture.charges().await, 0, "nothing committed");

    // Not stored, and not left in progress for a lease either.
    let (status, replayed, body) = send(&router, "pay-rb", "5").await;
    assert_eq!(
        (status, replayed, body.as_str()),
        (StatusCode::CREATED, false, "charge 2")
    );
    assert_eq!(app.runs(), 2);
    assert_eq!(fixture.charges().await, 1);
}

/// Crate docs, "the handler panicked: ... key released; next retry runs it", with the record
/// written by `respond_in` in the handler's transaction: the handler charges, writes its answer,
/// and panics before the commit. The unwind drops the transaction (a rollback: no charge, the
/// record back to in progress) and the request's future (the layer releases the key). The panic
/// reaches the caller, nothing is charged, and the retry runs the handler again and charges
/// once; a third request is a replay. Holds if the rollback reaches Postgres before the
/// release is refused by the row's lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_panics_after_respond_in_before_its_commit_frees_the_key() {
    let fixture = Fixture::new().await;
    let (router, app) = fixture.default_app(Duration::from_secs(60), vec![Plan::PanicBeforeCommit]);
    let first = {
        let router = router.clone();
        tokio::spawn(async move { send(&router, "pay-panic", "5").await }).await
    };
    assert!(
        first.unwrap_err().is_panic(),
        "the panic reaches the caller"
    );
    assert_eq!(fixture.charges().await, 0, "the charge rolled back");
    // The key is released, and the release awaited, before the panic goes on: the retry sent
    // the moment the panic is reported runs the handler (no `409` tolerated).
    let answer = send(&router, "pay-panic", "5").await;
    assert_eq!(
        (answer.0, answer.1, answer.2.as_str()),
        (StatusCode::CREATED, false, "charge 2"),
        "the retry ran the handler"
    );
    assert_replays(&router, "pay-panic", StatusCode::CREATED, "charge 2").await;
    assert_eq!(app.runs(), 2);
    assert_eq!(fixture.charges().await, 1);
}

/// `respond_in`'s docs: once the handler has returned, the layer "acts on what it finds [in the
/// record], not on what the handler returned". The handler charged and committed its `201`
/// record, then returned a `503` of its own (no mark of the record on it): by its status the
/// layer would release the key, but the record is completed, so the release (fenced on an
/// in-progress record) changes nothing and the retry is replayed, not charged again. Holds.
#[tokio::test]
async fn a_503_returned_after_a_committed_respond_in_does_not_free_the_key() {
    let fixture = Fixture::new().await;
    let (router, app) = fixture.default_app(LEASE, vec![Plan::CommitThenAnswer503]);
    let (status, _, _) = send(&router, "pay-other", "5").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(fixture.charges().await, 1);
    let (status, replayed, body) = send(&router, "pay-other", "5").await;
    assert_eq!(
        (status, replayed, body.as_str()),
        (StatusCode::CREATED, true, "charge 1"),
        "the committed record answers the retry"
    );
    assert_eq!(app.runs(), 1, "the handler ran once");
    assert_eq!(fixture.charges().await, 1);
}

/// `respond_in`'s docs: "a body over the layer's response limit is not kept (later duplicates
/// get the layer's "not replayable" answer, and never run the handler)". The handler charges
/// and answers a `200` of 4 KiB through `respond_in` with a 64-byte `response_limit`, and
/// commits: the first caller gets the whole body, the charge commits once, a retry gets the
/// `409` not-replayable problem (a failure of the layer's, not a stored failure of the
/// handler's) and never runs the handler again; a retry after the lease too. Holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_200_over_the_response_limit_through_respond_in_is_kept_as_not_replayable_and_charges_once(
) {
    let fixture = Fixture::new().await;
    let lease = Duration::from_millis(300);
    let (router, app) = fixture.limited_app(
        lease,
        tower_once_idempotency::predicate::DefaultPredicate,
        vec![Plan::Big(4096)],
        64,
    );
    let (status, replayed, body) = send(&router, "pay-big", "5").await;
    assert_eq!((status, replayed), (StatusCode::OK, false));
    assert_eq!(body.len(), 4096, "the first caller gets the whole body");
    assert_eq!(fixture.charges().await, 1, "the charge committed");

    let answer = support::send(&router, support::post("/charges", Some("pay-big"), "5")).await;
    assert_eq!(answer.status, StatusCode::CONFLICT, "{}", answer.text());
    assert!(
        answer.problem_type().ends_with("not-replayable"),
        "{}",
        answer.text()
    );
    // After the lease would have run out: still settled.
    tokio::time::sleep(lease * 2).await;
    let answer = support::send(&router, support::post("/charges", Some("pay-big"), "5")).await;
    assert_eq!(answer.status, StatusCode::CONFLICT, "{}", answer.text());
    assert!(answer.problem_type().ends_with("not-replayable"));
    assert_eq!(app.runs(), 1, "the handler ran once");
    assert_eq!(fixture.charges().await, 1);
    assert!(app.refusals().is_empty());
}

/// `respond_in`'s docs: a response the predicate would not store, "a gRPC failure in the
/// trailers" among them, "is returned as it is, and nothing is written: once the handler
/// returns it, the layer releases the key". The handler answers HTTP `200` with
/// `grpc-status: 14` (`UNAVAILABLE`) in the trailers through `respond_in`, charging nothing,
/// and commits: the caller gets the trailers, the retry runs the handler, which charges and
/// answers `grpc-status: 0`; a third request replays that. One charge, two runs. Holds.
#[tokio::test]
async fn a_grpc_unavailable_in_the_trailers_through_respond_in_is_not_stored_and_the_retry_charges_once(
) {
    use http_body_util::BodyExt;
    use tower::ServiceExt;
    let fixture = Fixture::new().await;
    let (router, app) = fixture.default_app(LEASE, vec![Plan::Grpc(14), Plan::Grpc(0)]);
    let res = router
        .clone()
        .oneshot(support::post("/charges", Some("pay-grpc"), "5"))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let collected = res.into_body().collect().await.unwrap();
    let trailers = collected.trailers().cloned();
    assert_eq!(
        trailers.as_ref().and_then(|t| t.get("grpc-status")),
        Some(&http::HeaderValue::from_static("14")),
        "the caller gets the failure in the trailers: {trailers:?}"
    );
    assert_eq!(fixture.charges().await, 0);

    let (status, replayed, body) = send(&router, "pay-grpc", "5").await;
    assert_eq!(
        (status, replayed, body.as_str()),
        (StatusCode::OK, false, "charge 2"),
        "the gRPC failure was not the key's answer: the retry ran the handler"
    );
    assert_replays(&router, "pay-grpc", StatusCode::OK, "charge 2").await;
    assert_eq!(app.runs(), 2);
    assert_eq!(fixture.charges().await, 1);
    assert!(app.refusals().is_empty());
}

/// `respond_in`'s table: a record "in progress, and that transaction rolled back" makes the
/// layer release the key at once. Two concurrent requests with one key: the first charges,
/// writes its record through `respond_in` and holds its transaction open; the second arrives
/// meanwhile (the row is locked: it waits on it or is answered `409`); then the first rolls
/// back. The second (a client retrying its `409`s every 50 ms) must run the handler and charge
/// once within a few seconds, long before the 10 s lease; a later request replays. Holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_waiting_on_a_respond_in_that_rolls_back_charges_once_soon() {
    let fixture = Fixture::new().await;
    let (router, app) = fixture.default_app(LEASE, vec![Plan::HeldThenRolledBack]);
    let first = {
        let router = router.clone();
        tokio::spawn(async move { send(&router, "pay-held", "5").await })
    };
    tokio::time::timeout(Duration::from_secs(5), app.entered.notified())
        .await
        .expect("the first request wrote its record");
    let second = {
        let router = router.clone();
        tokio::spawn(async move {
            let mut answer = send(&router, "pay-held", "5").await;
            let started = std::time::Instant::now();
            while answer.0 == StatusCode::CONFLICT && started.elapsed() < Duration::from_secs(15) {
                tokio::time::sleep(Duration::from_millis(50)).await;
                answer = send(&router, "pay-held", "5").await;
            }
            answer
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released = std::time::Instant::now();
    app.gate.notify_one();
    let (status, _, _) = first.await.unwrap();
    assert_eq!(status, StatusCode::CREATED, "the first caller's response");
    let (status, replayed, body) = second.await.unwrap();
    let waited = released.elapsed();
    assert_eq!(
        (status, replayed, body.as_str()),
        (StatusCode::CREATED, false, "charge 2"),
        "the duplicate ran the handler after the rollback (after {waited:?})"
    );
    assert!(
        waited < LEASE / 2,
        "the duplicate charged {waited:?} after the rollback: the key was held for the lease"
    );
    assert_replays(&router, "pay-held", StatusCode::CREATED, "charge 2").await;
    assert_eq!(app.runs(), 2);
    assert_eq!(fixture.charges().await, 1);
    assert!(app.refusals().is_empty());
}

/// `respond_in`'s docs: use it at `READ COMMITTED`, where a handler slower than its lease is
/// fine (the layer renews the lease every third of it). Lease 300 ms; the handler charges,
/// waits 600 ms, writes its record through `respond_in`, waits 600 ms more with the row locked
/// (the renewals wait on that lock), and commits. A duplicate sent 450 ms in, and another
/// during the second wait, must not run the handler; the request answers `201`; a retry replays
/// it. In the end: one charge, one run. Holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_committed_handler_slower_than_its_lease_charges_once() {
    let fixture = Fixture::new().await;
    let lease = Duration::from_millis(300);
    let (router, app) = fixture.default_app(
        lease,
        vec![Plan::Slow {
            before: lease * 2,
            after: lease * 2,
        }],
    );
    let first = {
        let router = router.clone();
        tokio::spawn(async move { send(&router, "pay-slow", "5").await })
    };
    tokio::time::sleep(lease * 3 / 2).await;
    let (status, replayed, body) = send(&router, "pay-slow", "5").await;
    assert_eq!(
        (status, replayed),
        (StatusCode::CONFLICT, false),
        "a duplicate past the lease while the handler runs: {body}"
    );
    tokio::time::sleep(lease).await;
    let during = send(&router, "pay-slow", "5").await;
    let (status, replayed, body) = first.await.unwrap();
    assert_eq!(
        (status, replayed, body.as_str()),
        (StatusCode::CREATED, false, "charge 1")
    );
    assert!(
        during.0 == StatusCode::CONFLICT || (during.0, during.1) == (StatusCode::CREATED, true),
        "a duplicate while the record's row is locked: {during:?}"
    );
    assert_replays(&router, "pay-slow", StatusCode::CREATED, "charge 1").await;
    assert_eq!(fixture.charges().await, 1);
    assert_eq!(app.runs(), 1);
    assert!(app.refusals().is_empty(), "{:?}", app.refusals());
}
