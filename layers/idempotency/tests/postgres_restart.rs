//! `PostgresStore` across a restart of the database (idempotency crate docs "Choosing a store" and
//! the store's docs: while Postgres is down the layer answers `503` without running handlers; the
//! pool replaces its connections, so requests succeed again once it is back, with no restart of the
//! service; committed records survive). The database is a cluster of the test's own, stopped in
//! immediate mode, as a crash.
#![cfg(feature = "postgres")]

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::routing::post;
use axum::Router;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tower::ServiceExt;
use tower_once_idempotency::store::postgres::PostgresStore;
use tower_once_idempotency::IdempotencyLayer;
use tower_once_test_support::postgres::PostgresServer;

fn keyed(key: &str) -> Request<Body> {
    Request::post("/charges")
        .header("idempotency-key", key)
        .body(Body::from("{\"amount\":5}"))
        .unwrap()
}

async fn status(router: &Router, key: &str) -> (StatusCode, bool) {
    let response = router.clone().oneshot(keyed(key)).await.unwrap();
    (
        response.status(),
        response.headers().contains_key("idempotent-replayed"),
    )
}

/// Sends `key` until it is answered `201`, not a replay (`503` meanwhile, while the database
/// comes back); bounded.
async fn run_once_recovered(router: &Router, key: &str) {
    let started = Instant::now();
    loop {
        match status(router, key).await {
            (StatusCode::CREATED, false) => return,
            (StatusCode::SERVICE_UNAVAILABLE, _) => {}
            other => panic!("{other:?}"),
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "never recovered"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_restart_answers_503_then_recovers_with_its_records() {
    let mut server = PostgresServer::start();
    let store = PostgresStore::connect(&server.url()).await.unwrap();
    store.migrate().await.unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&runs);
    let router = Router::new()
        .route(
            "/charges",
            post(move || {
                counter.fetch_add(1, SeqCst);
                async { (StatusCode::CREATED, "charged") }
            }),
        )
        .layer(IdempotencyLayer::with_store(store));

    assert_eq!(
        status(&router, "before").await,
        (StatusCode::CREATED, false)
    );
    server.stop();
    for key in ["before", "during"] {
        assert_eq!(
            status(&router, key).await.0,
            StatusCode::SERVICE_UNAVAILABLE
        );
    }
    assert_eq!(runs.load(SeqCst), 1, "no handler ran without a claim");

    server.restart();
    run_once_recovered(&router, "after").await;
    assert_eq!(
        status(&router, "before").await,
        (StatusCode::CREATED, true),
        "the record survived"
    );
    assert_eq!(runs.load(SeqCst), 2);
}

/// The transactional store across a crash of the database while a handler holds its claim's
/// transaction (its charge written, not committed): the commit fails, nothing is stored, and
/// once the database is back the client's retry charges once and later retries replay it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_crash_mid_transaction_leaves_the_retry_to_charge_once() {
    use tower_once_idempotency::store::postgres::sqlx;
    use tower_once_idempotency::{Claim, ClaimError};
    let mut server = PostgresServer::start();
    let store = PostgresStore::connect(&server.url())
        .await
        .unwrap()
        .transactional();
    store.migrate().await.unwrap();
    sqlx::query("CREATE TABLE charges (id bigserial PRIMARY KEY)")
        .execute(store.pool())
        .await
        .unwrap();
    let entered = Arc::new(tokio::sync::Notify::new());
    let gate = Arc::new(tokio::sync::Notify::new());
    let runs = Arc::new(AtomicUsize::new(0));
    let handler = {
        let (entered, gate, runs) = (entered.clone(), gate.clone(), runs.clone());
        move |claim: Claim<PostgresStore>| {
            let (entered, gate, runs) = (entered.clone(), gate.clone(), runs.clone());
            async move {
                let first = runs.fetch_add(1, SeqCst) == 0;
                let answer: Result<axum::response::Response, ClaimError> = async {
                    let mut tx = claim.transaction().await?;
                    sqlx::query("INSERT INTO charges DEFAULT VALUES")
                        .execute(&mut *tx)
                        .await?;
                    if first {
                        entered.notify_one();
                        gate.notified().await;
                    }
                    claim.commit(tx, (StatusCode::CREATED, "charged")).await
                }
                .await;
                axum::response::IntoResponse::into_response(answer)
            }
        }
    };
    let router = Router::new()
        .route("/charges", post(handler))
        .layer(IdempotencyLayer::with_store(store.clone()));

    let first = tokio::spawn({
        let router = router.clone();
        async move { status(&router, "k").await }
    });
    entered.notified().await;
    server.stop();
    gate.notify_one();
    assert_eq!(first.await.unwrap().0, StatusCode::SERVICE_UNAVAILABLE);

    server.restart();
    run_once_recovered(&router, "k").await;
    assert_eq!(status(&router, "k").await, (StatusCode::CREATED, true));
    let charges: i64 = sqlx::query_scalar("SELECT count(*) FROM charges")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(charges, 1);
}
