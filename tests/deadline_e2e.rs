//! The outcome at the deadline, against our own server (README, "Retries that cannot become a
//! storm"; the retry crate's `RetryError`): a keyed POST whose handler outlives the client's
//! deadline ends in a typed deadline error that says the operation may still complete and
//! carries the key, never in the server's `409 in progress` passed off as the answer; the same
//! key fetches the result afterwards, and the handler ran once.
#![cfg(feature = "retry")]

#[allow(dead_code)]
#[path = "../examples/server/app.rs"]
mod app;

use app::Ledger;
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::time::Duration;
use tower::{ServiceBuilder, ServiceExt};
use tower_once::idempotency::store::MemoryStore;
use tower_once::retry::RetryLayer;
use tower_once::timeout::http::HttpTimeoutLayer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_post_still_running_at_the_deadline_is_a_typed_error_with_its_key() {
    let ledger = Ledger::memory();
    let app = app::router(MemoryStore::new(), Duration::from_secs(10), ledger.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });

    let http = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let transport = Client::builder(TokioExecutor::new()).build_http();
    // Each attempt is cut at 300 ms, the operation at 1.2 s; the handler takes 2 s.
    let client = ServiceBuilder::new()
        .layer(
            RetryLayer::new()
                .deadline(Duration::from_millis(1200))
                .rng_seed(7)
                .into_http()
                .stamp_idempotency_keys(true),
        )
        .layer(HttpTimeoutLayer::new(Duration::from_millis(300)))
        .service(transport);
    let body = r#"{"order_id":"late","amount":700}"#;
    let charge = Request::post(format!("http://{addr}/charges?delay_ms=2000"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .unwrap();
    let err = client
        .oneshot(charge)
        .await
        .expect_err("the server's 409 in progress is not the operation's answer");
    assert!(err.is_deadline(), "{err}");
    assert!(err.may_have_executed(), "{err}");
    assert!(err.attempts() >= 2, "{err}");
    let key = err
        .idempotency_key()
        .expect("the stamped key, to fetch the result later")
        .to_owned();
    let text = err.to_string();
    assert!(
        text.contains("may still complete") && text.contains(&key),
        "{text}"
    );

    // Once the handler finished, the same request with the same key gets its answer.
    tokio::time::sleep(Duration::from_millis(2200)).await;
    let again = Request::post(format!("http://{addr}/charges?delay_ms=2000"))
        .header("content-type", "application/json")
        .header("idempotency-key", key.as_str())
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .unwrap();
    let res = http.request(again).await.unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    assert_eq!(res.headers()["idempotent-replayed"], "true");
    let _ = res.into_body().collect().await.unwrap();
    assert_eq!(
        ledger.charges().await.unwrap().len(),
        1,
        "the handler ran once"
    );
}

/// BREAK: the same keyed POST, with the stack's usual shape where the per-attempt timeout is
/// longer than what is left of the deadline (5 s per attempt, 1 s for the operation): the
/// deadline passes during the first attempt, the `HttpTimeoutLayer` below cuts it there (its
/// cap is the time left), and the retry layer returns that `Elapsed` as the inner error of a
/// deadline give-up. `RetryError::may_have_executed()` only looks for an error without an
/// inner one (error.rs), so it answers `false` for an attempt the deadline cut mid-flight, and
/// the error's text neither says the operation may still complete nor gives the key, while
/// the handler is still charging on the server (operation.rs `next_delay` / future.rs keep the
/// attempt's `Elapsed`; error.rs `may_have_executed` and `Outline`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_post_cut_at_the_deadline_by_the_attempt_timeout_may_have_executed() {
    let ledger = Ledger::memory();
    let app = app::router(MemoryStore::new(), Duration::from_secs(10), ledger.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });

    let transport = Client::builder(TokioExecutor::new()).build_http();
    let client = ServiceBuilder::new()
        .layer(
            RetryLayer::new()
                .deadline(Duration::from_secs(1))
                .into_http()
                .stamp_idempotency_keys(true),
        )
        .layer(HttpTimeoutLayer::new(Duration::from_secs(5)))
        .service(transport);
    let body = r#"{"order_id":"cut","amount":900}"#;
    let charge = Request::post(format!("http://{addr}/charges?delay_ms=2000"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .unwrap();
    let err = client
        .oneshot(charge)
        .await
        .expect_err("no answer came before the deadline");
    let text = err.to_string();
    assert!(err.is_deadline(), "{text}");
    assert_eq!(err.attempts(), 1, "{text}");
    let key = err
        .idempotency_key()
        .expect("the stamped key, to fetch the result later")
        .to_owned();

    // The handler was running when the deadline came: it charges once.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        ledger.charges().await.unwrap().len(),
        1,
        "the handler ran once"
    );
    assert!(
        err.may_have_executed(),
        "the attempt the deadline cut was still running on the server: {text}"
    );
    assert!(
        text.contains("may still complete") && text.contains(&key),
        "the error says so and gives the key: {text}"
    );
}
