//! The outcome at the deadline, against our own server (retry crate docs; the retry crate's
//! `RetryError`): a keyed POST whose handler outlives the client's deadline ends in a typed
//! deadline error that says the operation may still complete and carries the key, never in the
//! server's `409 in progress` passed off as the answer; the same key fetches the result afterwards,
//! and the handler ran once.
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
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;
use tower::{Layer, ServiceBuilder, ServiceExt};
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

/// The same keyed POST, with the stack's usual shape where the per-attempt timeout is longer than
/// what is left of the deadline (5 s per attempt, 1 s for the operation): the deadline passes
/// during the first attempt and the `HttpTimeoutLayer` below cuts it there (its cap is the time
/// left); the retry layer's error still says the operation may have executed
/// (`RetryError::may_have_executed()`), that it may still complete, and gives the key, while the
/// handler is still charging on the server. Was broken: `may_have_executed()` only looked for an
/// error without an inner one, so it answered `false` for an attempt the deadline cut mid-flight,
/// and the error's text said neither.
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

/// The demo server on loopback, with its ledger.
async fn demo() -> (std::net::SocketAddr, Ledger) {
    let ledger = Ledger::memory();
    let app = app::router(MemoryStore::new(), Duration::from_secs(10), ledger.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (addr, ledger)
}

fn keyed_charge(addr: std::net::SocketAddr, key: &str) -> Request<Full<Bytes>> {
    Request::post(format!("http://{addr}/charges?delay_ms=1500"))
        .header("content-type", "application/json")
        .header("idempotency-key", key)
        .body(Full::new(Bytes::from_static(
            br#"{"order_id":"busy","amount":100}"#,
        )))
        .unwrap()
}

/// The retry crate docs' `409` row ("if the deadline or the attempts run out first,
/// `Err(RetryError)` with `is_in_progress()` ... and the `Idempotency-Key`"): while our server
/// still runs a keyed charge, a duplicate whose attempts run out, one whose retry budget is spent,
/// and one sent through two stacked HTTP retry layers all end in an error that says the operation
/// is still running and may complete, with the key and the attempts, never the `409`; the handler
/// runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_progress_when_attempts_or_budget_run_out_is_an_error_with_the_key() {
    use tower_once::retry::budget::RetryBudget;
    let (addr, ledger) = demo().await;
    let http = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let first = tokio::spawn(http.request(keyed_charge(addr, "busy-1")));
    tokio::time::sleep(Duration::from_millis(150)).await;

    let two_attempts = RetryLayer::new()
        .max_attempts(2)
        .no_budget()
        .into_http()
        .layer(Client::builder(TokioExecutor::new()).build_http());
    let no_budget_left = RetryLayer::new()
        .budget(RetryBudget::new(0.0, 0, Duration::from_secs(10)))
        .into_http()
        .layer(Client::builder(TokioExecutor::new()).build_http());
    let stacked = RetryLayer::new()
        .max_attempts(2)
        .no_budget()
        .into_http()
        .layer(
            RetryLayer::new()
                .no_budget()
                .into_http()
                .layer(Client::builder(TokioExecutor::new()).build_http()),
        );
    // All three at once, while the charge runs (1.5 s; each 409 says "retry after 1 s").
    let (exhausted, refused, nested) = tokio::join!(
        two_attempts.oneshot(keyed_charge(addr, "busy-1")),
        no_budget_left.oneshot(keyed_charge(addr, "busy-1")),
        stacked.oneshot(keyed_charge(addr, "busy-1")),
    );
    let exhausted = exhausted.expect_err("in progress is not an answer");
    let refused = refused.expect_err("in progress is not an answer");
    let nested = nested.expect_err("in progress is not an answer");
    let nested_attempts = nested.attempts();
    for (err, attempts) in [(&exhausted, 2), (&refused, 1)] {
        let text = err.to_string();
        assert!(err.is_in_progress() && err.may_have_executed(), "{text}");
        assert_eq!(err.idempotency_key(), Some("busy-1"), "{text}");
        assert_eq!(err.attempts(), attempts, "{text}");
        assert!(
            text.contains("still running") && text.contains("busy-1"),
            "{text}"
        );
    }
    assert_eq!(exhausted.reason(), tower_once::retry::GiveUp::Exhausted);
    assert_eq!(refused.reason(), tower_once::retry::GiveUp::Budget);
    assert!(
        nested.is_in_progress() && nested.idempotency_key() == Some("busy-1"),
        "{nested}"
    );
    assert_eq!(nested_attempts, 2, "the inner layer deferred: {nested}");

    let first = first.await.unwrap().unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    assert_eq!(
        ledger.charges().await.unwrap().len(),
        1,
        "the handler ran once"
    );
}

/// A charge route behind an `IdempotencyLayer` whose errors are in the API's own format (no
/// `Retry-After` on them), with a 2 s handler that counts its runs.
async fn custom_problems(runs: Arc<AtomicUsize>) -> std::net::SocketAddr {
    use tower_once::idempotency::problem::ProblemKind;
    use tower_once::idempotency::IdempotencyLayer;
    let app = axum::Router::new()
        .route(
            "/charges",
            axum::routing::post(move || {
                runs.fetch_add(1, SeqCst);
                async {
                    tokio::time::sleep(Duration::from_secs(2)).await;
                    (StatusCode::CREATED, "charged")
                }
            }),
        )
        .layer(
            IdempotencyLayer::new().problem_response(|kind: ProblemKind, _retry_after| {
                let mut res = http::Response::new(Bytes::from(format!(
                    r#"{{"error":"{}"}}"#,
                    kind.type_uri()
                )));
                *res.status_mut() = kind.status();
                res
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

/// With a custom `problem_response` that sends no `Retry-After`, a keyed POST still
/// running at the deadline ends in the typed error (in progress, deadline, the key), never the
/// custom `409`; the handler runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_custom_problem_response_still_gives_the_typed_error_at_the_deadline() {
    let runs = Arc::new(AtomicUsize::new(0));
    let addr = custom_problems(runs.clone()).await;
    let client = ServiceBuilder::new()
        .layer(
            RetryLayer::new()
                .deadline(Duration::from_millis(1200))
                .max_attempts(100)
                .no_budget()
                .backoff(
                    tower_once::retry::backoff::Backoff::new(
                        Duration::from_millis(100),
                        1.0,
                        Duration::from_millis(100),
                    )
                    .unwrap(),
                )
                .into_http()
                .stamp_idempotency_keys(true),
        )
        .layer(HttpTimeoutLayer::new(Duration::from_millis(300)))
        .service(Client::builder(TokioExecutor::new()).build_http());
    let charge = Request::post(format!("http://{addr}/charges"))
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    let err = client.oneshot(charge).await.expect_err("not the 409");
    assert!(err.is_in_progress() && err.is_deadline(), "{err}");
    assert!(err.idempotency_key().is_some(), "{err}");
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(runs.load(SeqCst), 1);
}

/// A user classifier that treats a `409` as transient (`Action::Retry`, as this repository's own
/// outbox tests write one), on a client of our server: the server marks its answer
/// `Idempotency-In-Progress: true`, and a chosen classifier that retries such an answer has it
/// treated as in progress (the retry crate's `classify::HttpDefault`), so at the deadline the
/// caller gets the typed error, never the `409` as the operation's answer. Was broken: only
/// `Action::InProgress` made the layer remember it, and the caller got `Ok(409 "Request in
/// progress")` back while the charge was still running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_classifier_that_retries_409s_still_never_returns_the_409() {
    use tower_once::retry::classify::{Action, Classify, HttpClassifier};
    let runs = Arc::new(AtomicUsize::new(0));
    let addr = custom_problems(runs.clone()).await;
    let conflict_is_transient =
        |outcome: &Result<http::Response<hyper::body::Incoming>, _>| match outcome {
            Ok(r) if r.status() == StatusCode::CONFLICT => Action::Retry { after: None },
            other => HttpClassifier.classify(other),
        };
    let http = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let first = tokio::spawn(
        http.request(
            Request::post(format!("http://{addr}/charges"))
                .header("idempotency-key", "transient-409")
                .body(Full::new(Bytes::from_static(b"{}")))
                .unwrap(),
        ),
    );
    tokio::time::sleep(Duration::from_millis(150)).await;
    let client = RetryLayer::new()
        .no_budget()
        .deadline(Duration::from_millis(800))
        .classify(conflict_is_transient)
        .into_http()
        .layer(
            Client::builder(TokioExecutor::new())
                .build_http::<tower_once::retry::http::BufferedBody<Full<Bytes>>>(),
        );
    let outcome = client
        .oneshot(
            Request::post(format!("http://{addr}/charges"))
                .header("idempotency-key", "transient-409")
                .body(Full::new(Bytes::from_static(b"{}")))
                .unwrap(),
        )
        .await;
    let _ = first.await;
    assert_eq!(runs.load(SeqCst), 1, "the duplicate never ran");
    match outcome {
        Ok(response) => panic!(
            "the server's in-progress answer came back as the answer: {}",
            response.status()
        ),
        Err(err) => assert!(err.is_in_progress(), "{err}"),
    }
}
