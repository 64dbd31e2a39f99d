//! One transaction per fresh request (`PostgresStore::transactional`, its rustdoc and the
//! stores doc): the claim opens the handler's transaction with the key's lock; the record
//! commits with the effects; a rollback, an error or a killed connection frees the key at once;
//! a failure is never stored as the key's answer.
#![cfg(feature = "postgres")]

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use sqlx::Acquire;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tower_once_idempotency::store::postgres::PostgresStore;
use tower_once_idempotency::{Claim, ClaimError, IdempotencyLayer};

mod support;

use support::{charge_through, ChargesDb};

/// What the handler does on one run (runs take the plans in order; then [`Plan::Answer`] 201).
#[derive(Clone, Copy, Debug)]
enum Plan {
    /// Charge, commit through the claim with `status`.
    Answer(StatusCode),
    /// Charge, then return an error before committing (the transaction is dropped).
    FailBeforeCommit,
    /// Charge, then panic before committing.
    PanicBeforeCommit,
    /// Charge inside a savepoint that is rolled back, charge again after it, commit.
    SavepointRolledBack,
    /// Charge, say so on `App::entered`, wait for `App::gate`, commit.
    Held,
    /// Answer 201 without taking the transaction (the layer records it).
    Untaken,
    /// Answer 503 without taking the transaction (the layer releases it).
    UntakenFailure,
    /// Charge, commit, then take the transaction again and commit again.
    Twice,
    /// Charge at `SERIALIZABLE` after reading every charge, say so and wait for the gate, commit.
    Serializable,
}

#[derive(Clone)]
struct App {
    schema: String,
    runs: Arc<AtomicUsize>,
    plans: Arc<Mutex<VecDeque<Plan>>>,
    errors: Arc<Mutex<Vec<String>>>,
    entered: Arc<tokio::sync::Notify>,
    gate: Arc<tokio::sync::Notify>,
    /// The backend of the last [`Plan::Held`] transaction.
    backend: Arc<std::sync::atomic::AtomicI32>,
}

impl App {
    fn runs(&self) -> usize {
        self.runs.load(SeqCst)
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
    match handle(&app, &claim, run, plan).await {
        Ok(response) => response,
        Err(error) => {
            app.errors.lock().unwrap().push(error.to_string());
            error.into_response()
        }
    }
}

async fn insert_charge(app: &App, conn: &mut sqlx::PgConnection) -> Result<(), ClaimError> {
    sqlx::query(&format!(
        "INSERT INTO {}.charges (amount) VALUES (5)",
        app.schema
    ))
    .execute(conn)
    .await?;
    Ok(())
}

async fn handle(
    app: &App,
    claim: &Claim<PostgresStore>,
    run: usize,
    plan: Plan,
) -> Result<Response, ClaimError> {
    let answer = format!("charge {run}");
    match plan {
        Plan::Untaken => return Ok((StatusCode::CREATED, answer).into_response()),
        Plan::UntakenFailure => {
            return Ok((StatusCode::SERVICE_UNAVAILABLE, answer).into_response());
        }
        _ => {}
    }
    let mut tx = claim.transaction().await?;
    match plan {
        Plan::Serializable => {
            sqlx::query(&format!("SELECT count(*) FROM {}.charges", app.schema))
                .execute(&mut *tx)
                .await?;
            insert_charge(app, &mut tx).await?;
            app.entered.notify_one();
            app.gate.notified().await;
        }
        Plan::SavepointRolledBack => {
            let mut savepoint = (&mut *tx).begin().await?;
            insert_charge(app, &mut savepoint).await?;
            savepoint.rollback().await?;
            insert_charge(app, &mut tx).await?;
        }
        Plan::Answer(status) if !status.is_success() => {}
        _ => insert_charge(app, &mut tx).await?,
    }
    match plan {
        Plan::FailBeforeCommit => {
            return Ok((StatusCode::SERVICE_UNAVAILABLE, "failed before commit").into_response())
        }
        Plan::PanicBeforeCommit => panic!("the handler panics before its commit"),
        Plan::Held => {
            let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
                .fetch_one(&mut *tx)
                .await?;
            app.backend.store(pid, SeqCst);
            app.entered.notify_one();
            app.gate.notified().await;
        }
        _ => {}
    }
    let status = match plan {
        Plan::Answer(status) => status,
        _ => StatusCode::CREATED,
    };
    let response = claim.commit(tx, (status, answer)).await?;
    if let Plan::Twice = plan {
        claim.transaction().await?;
    }
    Ok(response)
}

/// `charge_through` on a task of its own, for a request that runs while the test acts.
fn spawn_charge(
    router: &Router,
    key: &'static str,
) -> tokio::task::JoinHandle<(StatusCode, bool, String)> {
    let router = router.clone();
    tokio::spawn(async move { charge_through(&router, key, "{}").await })
}

async fn app(db: &ChargesDb, plans: &[Plan]) -> (App, Router) {
    app_on(db.store.clone(), db, plans)
}

fn app_on(store: PostgresStore, db: &ChargesDb, plans: &[Plan]) -> (App, Router) {
    let app = App {
        schema: db.schema.name.clone(),
        runs: Arc::default(),
        plans: Arc::new(Mutex::new(plans.iter().copied().collect())),
        errors: Arc::default(),
        entered: Arc::default(),
        gate: Arc::default(),
        backend: Arc::default(),
    };
    let layer = IdempotencyLayer::with_store(store.transactional());
    let router = Router::new()
        .route("/charges", post(charge).layer(layer))
        .with_state(app.clone());
    (app, router)
}

#[tokio::test]
async fn a_fresh_key_commits_its_charge_and_record_together_and_replays() {
    let db = ChargesDb::new().await;
    let (app, router) = app(&db, &[]).await;
    let first = charge_through(&router, "k", "{}").await;
    assert_eq!(first, (StatusCode::CREATED, false, "charge 1".into()));
    let again = charge_through(&router, "k", "{}").await;
    assert_eq!(again, (StatusCode::CREATED, true, "charge 1".into()));
    let other = charge_through(&router, "k", "{\"other\":1}").await;
    assert_eq!(other.0, StatusCode::UNPROCESSABLE_ENTITY, "{other:?}");
    assert_eq!((app.runs(), db.charges().await), (1, 1));
}

#[tokio::test]
async fn a_duplicate_while_the_first_runs_gets_409_at_once_then_the_replay() {
    let db = ChargesDb::new().await;
    let (app, router) = app(&db, &[Plan::Held]).await;
    let first = spawn_charge(&router, "k");
    app.entered.notified().await;
    let during = charge_through(&router, "k", "{}").await;
    assert_eq!(during.0, StatusCode::CONFLICT, "{during:?}");
    // Another body while it runs: no row to compare yet, so 409 too.
    let other = charge_through(&router, "k", "{\"x\":1}").await;
    assert_eq!(other.0, StatusCode::CONFLICT, "{other:?}");
    app.gate.notify_one();
    assert_eq!(first.await.unwrap().0, StatusCode::CREATED);
    let after = charge_through(&router, "k", "{}").await;
    assert_eq!(after, (StatusCode::CREATED, true, "charge 1".into()));
    assert_eq!((app.runs(), db.charges().await), (1, 1));
}

#[tokio::test]
async fn concurrent_duplicates_charge_once() {
    let db = ChargesDb::new().await;
    let (app, router) = app(&db, &[]).await;
    let tries: Vec<_> = (0..32)
        .map(|_| {
            let router = router.clone();
            tokio::spawn(async move { charge_through(&router, "k", "{}").await })
        })
        .collect();
    for t in tries {
        let (status, _, _) = t.await.unwrap();
        assert!(
            status == StatusCode::CREATED || status == StatusCode::CONFLICT,
            "{status}"
        );
    }
    assert_eq!((app.runs(), db.charges().await), (1, 1));
    let after = charge_through(&router, "k", "{}").await;
    assert_eq!(after, (StatusCode::CREATED, true, "charge 1".into()));
}

#[tokio::test]
async fn a_5xx_or_a_validation_4xx_through_commit_is_never_the_keys_answer() {
    let db = ChargesDb::new().await;
    let (app, router) = app(
        &db,
        &[
            Plan::Answer(StatusCode::SERVICE_UNAVAILABLE),
            Plan::Answer(StatusCode::UNPROCESSABLE_ENTITY),
        ],
    )
    .await;
    let first = charge_through(&router, "k", "{}").await;
    assert_eq!(first.0, StatusCode::SERVICE_UNAVAILABLE);
    let second = charge_through(&router, "k", "{}").await;
    assert_eq!(second.0, StatusCode::UNPROCESSABLE_ENTITY);
    // The fixed resend, another body: it runs.
    let fixed = charge_through(&router, "k", "{\"fixed\":true}").await;
    assert_eq!(fixed, (StatusCode::CREATED, false, "charge 3".into()));
    assert_eq!((app.runs(), db.charges().await), (3, 1));
}

#[tokio::test]
async fn an_error_or_a_panic_before_the_commit_frees_the_key_at_once() {
    let db = ChargesDb::new().await;
    let (app, router) = app(&db, &[Plan::FailBeforeCommit, Plan::PanicBeforeCommit]).await;
    let failed = charge_through(&router, "k", "{}").await;
    assert_eq!(failed.0, StatusCode::SERVICE_UNAVAILABLE);
    // No lease to wait out: the next try runs at once.
    let panicked = spawn_charge(&router, "k").await;
    assert!(panicked.is_err() || panicked.unwrap().0.is_server_error());
    // A panicked handler's key is released (its transaction rolled back) before the panic goes
    // on: a retry sent the instant the panic is reported runs.
    let retry = charge_through(&router, "k", "{}").await;
    assert_eq!(retry, (StatusCode::CREATED, false, "charge 3".into()));
    assert_eq!((app.runs(), db.charges().await), (3, 1));
}

#[tokio::test]
async fn a_savepoint_rolled_back_keeps_the_rest_and_the_record() {
    let db = ChargesDb::new().await;
    let (app, router) = app(&db, &[Plan::SavepointRolledBack]).await;
    let first = charge_through(&router, "k", "{}").await;
    assert_eq!(first, (StatusCode::CREATED, false, "charge 1".into()));
    let again = charge_through(&router, "k", "{}").await;
    assert!(again.1, "{again:?}");
    assert_eq!((app.runs(), db.charges().await), (1, 1));
}

#[tokio::test]
async fn a_handler_that_never_takes_the_transaction_is_recorded_by_the_layer() {
    let db = ChargesDb::new().await;
    let (app, router) = app(&db, &[Plan::Untaken]).await;
    let first = charge_through(&router, "k", "{}").await;
    assert_eq!(first, (StatusCode::CREATED, false, "charge 1".into()));
    let again = charge_through(&router, "k", "{}").await;
    assert_eq!(again, (StatusCode::CREATED, true, "charge 1".into()));
    assert_eq!(app.runs(), 1);
}

#[tokio::test]
async fn a_second_transaction_is_refused_as_misuse_and_the_first_commit_stands() {
    let db = ChargesDb::new().await;
    let (app, router) = app(&db, &[Plan::Twice]).await;
    let first = charge_through(&router, "k", "{}").await;
    assert_eq!(first.0, StatusCode::INTERNAL_SERVER_ERROR, "{first:?}");
    let errors = app.errors.lock().unwrap().clone();
    assert!(errors[0].contains("already taken"), "{errors:?}");
    // The commit happened: the retry replays it, never a 500, never a second charge.
    let again = charge_through(&router, "k", "{}").await;
    assert_eq!(again, (StatusCode::CREATED, true, "charge 1".into()));
    assert_eq!((app.runs(), db.charges().await), (1, 1));
}

#[tokio::test]
async fn a_killed_connection_mid_handler_frees_the_key_at_once() {
    let db = ChargesDb::new().await;
    let (app, router) = app(&db, &[Plan::Held]).await;
    let first = spawn_charge(&router, "k");
    app.entered.notified().await;
    // The backend holding the key's lock (idle in its transaction) is terminated.
    let killed: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(app.backend.load(SeqCst))
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert!(killed);
    let retry = charge_through(&router, "k", "{}").await;
    assert_eq!(retry, (StatusCode::CREATED, false, "charge 2".into()));
    app.gate.notify_one();
    let first = first.await.unwrap();
    assert_eq!(first.0, StatusCode::SERVICE_UNAVAILABLE, "{first:?}");
    assert_eq!((app.runs(), db.charges().await), (2, 1));
    let again = charge_through(&router, "k", "{}").await;
    assert_eq!(again, (StatusCode::CREATED, true, "charge 2".into()));
}

#[tokio::test]
async fn a_serialization_failure_at_commit_is_never_stored_and_the_retry_charges_once() {
    let db = ChargesDb::new().await;
    // Every transaction of this pool is SERIALIZABLE (the claim's transaction begins before
    // the handler's first statement, so the level is the session's).
    let options: sqlx::postgres::PgConnectOptions =
        tower_once_test_support::postgres::database_url()
            .parse()
            .unwrap();
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(8)
        .connect_with(options.options([("default_transaction_isolation", "serializable")]))
        .await
        .unwrap();
    let store = PostgresStore::new(pool)
        .table(db.store.table_name())
        .unwrap();
    let (app, router) = app_on(store, &db, &[Plan::Serializable, Plan::Serializable]);
    // Two keys, each reading every charge then charging at SERIALIZABLE, overlapping: one of
    // them fails to serialize (at its insert or its commit).
    let a = spawn_charge(&router, "a");
    app.entered.notified().await;
    let b = spawn_charge(&router, "b");
    app.entered.notified().await;
    app.gate.notify_one();
    app.gate.notify_one();
    let (a, b) = (a.await.unwrap(), b.await.unwrap());
    let statuses = [a.0, b.0];
    assert!(statuses.contains(&StatusCode::CREATED), "{a:?} {b:?}");
    for (key, answer) in [("a", a), ("b", b)] {
        if answer.0 != StatusCode::CREATED {
            assert_eq!(answer.0, StatusCode::SERVICE_UNAVAILABLE, "{answer:?}");
            let retry = charge_through(&router, key, "{}").await;
            assert_eq!(retry.0, StatusCode::CREATED, "{retry:?}");
            assert!(!retry.1, "the failure was not stored");
        }
        let replay = charge_through(&router, key, "{}").await;
        assert!(replay.1, "{replay:?}");
    }
    assert_eq!(db.charges().await, 2);
    assert!(app.runs() >= 2);
}

#[tokio::test]
async fn respond_in_on_a_transactional_store_is_refused_clearly() {
    let db = ChargesDb::new().await;
    let store = db.store.clone().transactional();
    let router = Router::new().route(
        "/charges",
        post(|claim: Claim<PostgresStore>| async move {
            let mut conn = claim.store().pool().acquire().await.unwrap();
            match claim.respond_in(&mut conn, StatusCode::CREATED).await {
                Ok(response) => response,
                Err(error) => {
                    assert!(error.is_misused(), "{error}");
                    error.into_response()
                }
            }
        })
        .layer(IdempotencyLayer::with_store(store)),
    );
    let answer = charge_through(&router, "k", "{}").await;
    assert_eq!(answer.0, StatusCode::INTERNAL_SERVER_ERROR, "{answer:?}");
    assert!(answer.2.contains("Claim::transaction"), "{answer:?}");
    // Not stored: the key is free.
    let again = charge_through(&router, "k", "{}").await;
    assert!(!again.1);
}

#[tokio::test]
async fn the_lock_bounds_a_frozen_owner_by_the_idle_timeout() {
    // The lease is the transaction's idle bound: an owner idle in its transaction past it
    // (frozen, or waiting on something slow) is ended by Postgres, and the key is free.
    let db = ChargesDb::new().await;
    let (app, _) = app(&db, &[Plan::Held]).await;
    let layer = IdempotencyLayer::with_store(db.store.clone().transactional())
        .lease(Duration::from_millis(500));
    let router = Router::new()
        .route("/charges", post(charge).layer(layer))
        .with_state(app.clone());
    let first = spawn_charge(&router, "k");
    app.entered.notified().await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let retry = charge_through(&router, "k", "{}").await;
    assert_eq!(retry, (StatusCode::CREATED, false, "charge 2".into()));
    app.gate.notify_one();
    let first = first.await.unwrap();
    assert_eq!(first.0, StatusCode::SERVICE_UNAVAILABLE, "{first:?}");
    assert_eq!(db.charges().await, 1);
}

/// The answer to a failed run is sent only once its transaction has ended: a retry sent on
/// that answer never finds the key still taken (it once could, while the dropped transaction's
/// rollback was still on its way to the database).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_sent_on_the_failures_answer_never_finds_the_key_taken() {
    let db = ChargesDb::new().await;
    let plans: Vec<Plan> = (0..50)
        .flat_map(|i| {
            let failure = if i % 2 == 0 {
                Plan::FailBeforeCommit
            } else {
                Plan::UntakenFailure
            };
            [failure, Plan::Answer(StatusCode::CREATED)]
        })
        .collect();
    let (app, router) = app(&db, &plans).await;
    for i in 0..50 {
        let key = format!("k{i}");
        let failed = charge_through(&router, &key, "{}").await;
        assert_eq!(failed.0, StatusCode::SERVICE_UNAVAILABLE, "{failed:?}");
        let retry = charge_through(&router, &key, "{}").await;
        assert_eq!(retry.0, StatusCode::CREATED, "key {i}: {retry:?}");
    }
    assert_eq!((app.runs(), db.charges().await), (100, 50));
}

/// The layer's completion while its renewal has the transaction out for its keep-alive: the
/// completion waits for the transaction to come back and records it (it once found the entry
/// "renewing", wrote nothing, and the key was free for a second run).
#[tokio::test]
async fn a_completion_during_a_renewal_still_records_the_answer() {
    use tower_once_idempotency::fingerprint::Fingerprint;
    use tower_once_idempotency::store::{
        ClaimOutcome, ClaimToken, Completion, IdempotencyStore, RecordState, StoreKey,
        StoredResponse,
    };
    let db = ChargesDb::new().await;
    let store = db.store.clone().transactional();
    let key = StoreKey::from_bytes([7; 32]);
    let fingerprint = Fingerprint::from_bytes([1; 32]);
    let (token, lease) = (ClaimToken::new(), Duration::from_secs(5));
    let claimed = store.claim(key, token, fingerprint, lease).await.unwrap();
    assert!(matches!(claimed, ClaimOutcome::Claimed));
    // The renewal sends its keep-alive and waits for the answer.
    let mut renewal = store.extend(key, token, lease);
    tokio::select! {
        biased;
        _ = &mut renewal => panic!("the keep-alive answered before it was read"),
        () = std::future::ready(()) => {}
    }
    let answer = StoredResponse::new(StatusCode::CREATED, Default::default(), "done".into());
    let completed = store
        .complete(
            key,
            token,
            Completion::Response(answer),
            Duration::from_secs(60),
        )
        .await
        .unwrap();
    assert!(completed, "the completion recorded the answer");
    assert!(renewal.await.is_ok());
    let again = store
        .claim(key, ClaimToken::new(), fingerprint, lease)
        .await
        .unwrap();
    match again {
        ClaimOutcome::Existing(record) => {
            assert!(matches!(record.state, RecordState::Completed(r) if r.body == "done"));
        }
        ClaimOutcome::Claimed => panic!("the key was free: the answer was never recorded"),
    }
}

/// The default table name in a schema of its own migrates and serves (its migration once
/// qualified the schema twice in the functions' names, and qualified the index's).
#[tokio::test]
async fn the_default_table_name_in_a_schema_migrates_and_serves() {
    let db = ChargesDb::new().await;
    let store = PostgresStore::new(db.pool().clone())
        .table(&format!("{}.idempotency_records", db.schema.name))
        .unwrap();
    store.migrate().await.unwrap();
    let (app, router) = app_on(store, &db, &[]);
    let first = charge_through(&router, "k", "{}").await;
    assert_eq!(first, (StatusCode::CREATED, false, "charge 1".into()));
    let again = charge_through(&router, "k", "{}").await;
    assert!(again.1, "{again:?}");
    assert_eq!((app.runs(), db.charges().await), (1, 1));
}
