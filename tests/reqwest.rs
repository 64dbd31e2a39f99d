//! A retrying `reqwest::Client` against the demo server on loopback: requests built the reqwest
//! way, one stamped key on every attempt, `Retry-After` honoured, a `503` retried by default.
#![cfg(feature = "reqwest")]

#[allow(dead_code)] // the Redis ledger is not used here
#[path = "../examples/server/app.rs"]
mod app;

use app::Ledger;
use axum::extract::Request;
use axum::middleware::{self, Next};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tower::{Layer, ServiceBuilder};
use tower_once::idempotency::store::MemoryStore;
use tower_once::retry::hook::RetryEvent;
use tower_once::retry::reqwest::{RequestBuilderExt, ReqwestService};
use tower_once::retry::RetryLayer;
use tower_once::timeout::http::HttpTimeoutLayer;

const ORDER: &str = r#"{"order_id":"A","amount":500}"#;

/// The demo server, with every request's `Idempotency-Key` recorded in front of it.
async fn demo_server() -> (String, Arc<Mutex<Vec<String>>>, Ledger) {
    let keys = Arc::new(Mutex::new(Vec::new()));
    let seen = keys.clone();
    let ledger = Ledger::memory();
    let app = app::router(MemoryStore::new(), Duration::from_secs(10), ledger.clone()).layer(
        middleware::from_fn(move |req: Request, next: Next| {
            let seen = seen.clone();
            async move {
                if let Some(key) = req.headers().get("idempotency-key") {
                    seen.lock().unwrap().push(key.to_str().unwrap().to_owned());
                }
                next.run(req).await
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}"), keys, ledger)
}

#[tokio::test]
async fn a_503_is_retried_by_default_with_one_stamped_key() {
    let (base, keys, ledger) = demo_server().await;
    let client = reqwest::Client::new();
    let retrying = ServiceBuilder::new()
        .layer(
            RetryLayer::new()
                .backoff(
                    tower_once::retry::backoff::Backoff::new(
                        Duration::from_millis(5),
                        2.0,
                        Duration::from_millis(20),
                    )
                    .unwrap(),
                )
                .into_http()
                .stamp_idempotency_keys(true),
        )
        .layer(HttpTimeoutLayer::new(Duration::from_secs(2)))
        .service(ReqwestService::new(client.clone()));
    let response = client
        .post(format!("{base}/charges?fail=503"))
        .header("content-type", "application/json")
        .body(ORDER)
        .send_with(retrying)
        .await
        .unwrap();
    assert_eq!(response.status(), 503, "the last answer, after retrying");
    let keys = keys.lock().unwrap().clone();
    assert_eq!(keys.len(), 4, "4 attempts: {keys:?}");
    assert!(
        keys.iter().all(|k| *k == keys[0]),
        "one key on every attempt"
    );
    assert!(ledger.charges().await.unwrap().is_empty());
}

#[tokio::test]
async fn a_duplicate_in_flight_waits_for_retry_after_and_gets_the_replay() {
    let (base, _keys, ledger) = demo_server().await;
    let client = reqwest::Client::new();
    let waits = Arc::new(Mutex::new(Vec::new()));
    let log = waits.clone();
    let retrying = ServiceBuilder::new()
        .layer(RetryLayer::new().into_http().on_retry(
            move |event: &RetryEvent<'_, http::Response<reqwest::Body>, _>| {
                log.lock().unwrap().push((event.delay, event.from_server));
            },
        ))
        .service(ReqwestService::new(client.clone()));
    let url = format!("{base}/charges?delay_ms=600");
    let first = {
        let request = client
            .post(&url)
            .header("idempotency-key", "order-A")
            .header("content-type", "application/json")
            .body(ORDER);
        tokio::spawn(request.send())
    };
    tokio::time::sleep(Duration::from_millis(150)).await;
    let duplicate = client
        .post(&url)
        .header("idempotency-key", "order-A")
        .header("content-type", "application/json")
        .body(ORDER)
        .send_with(retrying)
        .await
        .unwrap();
    assert_eq!(duplicate.status(), 201);
    assert_eq!(
        duplicate.headers().get("idempotent-replayed").unwrap(),
        "true"
    );
    assert_eq!(first.await.unwrap().unwrap().status(), 201);
    let waits = waits.lock().unwrap().clone();
    assert!(!waits.is_empty(), "the 409 was retried");
    assert!(
        waits.iter().all(|&(_, from_server)| from_server),
        "{waits:?}"
    );
    assert_eq!(
        waits[0].0,
        Duration::from_secs(1),
        "Retry-After: 1 honoured"
    );
    assert_eq!(ledger.charges().await.unwrap().len(), 1);
}

#[tokio::test]
async fn a_bad_url_is_a_build_error_not_a_panic() {
    let client = reqwest::Client::new();
    let svc = RetryLayer::new()
        .into_http()
        .layer(ReqwestService::new(client.clone()));
    let err = client.get("not a url").send_with(svc).await.unwrap_err();
    assert!(err.is_build());
}

/// One cloneable client, requests built the reqwest way, `.json(..)` and `.send()`: a 503 is
/// retried with one stamped key, and the 503 that remains is the answer.
#[tokio::test]
async fn the_client_sends_json_and_retries_a_503_with_one_key() {
    use tower_once::retry::reqwest::Client;
    let (base, keys, ledger) = demo_server().await;
    let client = Client::builder(reqwest::Client::new())
        .retry(
            RetryLayer::new()
                .backoff(
                    tower_once::retry::backoff::Backoff::new(
                        Duration::from_millis(5),
                        2.0,
                        Duration::from_millis(20),
                    )
                    .unwrap(),
                )
                .into_http()
                .stamp_idempotency_keys(true),
        )
        .attempt_timeout(Duration::from_secs(2))
        .build();
    let order = serde_json::json!({ "order_id": "A", "amount": 500 });
    let response = client
        .clone()
        .post(format!("{base}/charges?fail=503"))
        .json(&order)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 503, "the last answer, after retrying");
    let sent = keys.lock().unwrap().clone();
    assert_eq!(sent.len(), 4, "4 attempts: {sent:?}");
    assert!(
        sent.iter().all(|k| *k == sent[0]),
        "one key on every attempt"
    );

    let created = client
        .post(format!("{base}/charges"))
        .json(&order)
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);
    assert_eq!(ledger.charges().await.unwrap().len(), 1);
}

/// The client's one error: a deadline that passes while the server still runs the charge is
/// `is_deadline()`, `may_have_executed()`, with the stamped key and the attempts made; the key
/// then fetches the stored answer.
#[tokio::test]
async fn the_clients_error_says_deadline_attempts_and_key() {
    use tower_once::retry::reqwest::Client;
    let (base, _keys, ledger) = demo_server().await;
    let client = Client::builder(reqwest::Client::new())
        .retry(
            RetryLayer::new()
                .deadline(Duration::from_millis(1200))
                .into_http()
                .stamp_idempotency_keys(true),
        )
        .attempt_timeout(Duration::from_millis(300))
        .build();
    let order = serde_json::json!({ "order_id": "B", "amount": 900 });
    let err = client
        .post(format!("{base}/charges?delay_ms=2000"))
        .json(&order)
        .send()
        .await
        .unwrap_err();
    assert!(err.is_deadline() && err.is_timeout(), "{err}");
    assert!(err.may_have_executed(), "{err}");
    assert!(err.attempts() >= 2, "{err}");
    let key = err.idempotency_key().unwrap().to_owned();
    tokio::time::sleep(Duration::from_millis(2200)).await;
    let replay = client
        .post(format!("{base}/charges?delay_ms=2000"))
        .idempotency_key(&key)
        .json(&order)
        .send()
        .await
        .unwrap();
    assert_eq!(replay.status(), 201);
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(ledger.charges().await.unwrap().len(), 1);

    let bad = client.get("not a url").send().await.unwrap_err();
    assert!(bad.is_builder() && bad.reqwest().is_some() && bad.attempts() == 0);
}
