//! A retrying `reqwest::Client` (`retry::reqwest` docs) against the demo server on loopback:
//! requests built the reqwest way, one stamped key on every attempt, `Retry-After` honoured, a
//! `503` retried by default, only safe or keyed requests retried, reqwest's errors kept.
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
        .attempt_limit(Duration::from_secs(2))
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
        .attempt_limit(Duration::from_millis(300))
        .build();
    let order = serde_json::json!({ "order_id": "B", "amount": 900 });
    let err = client
        .post(format!("{base}/charges?delay_ms=2000"))
        .json(&order)
        .send()
        .await
        .unwrap_err();
    assert!(err.is_deadline() && err.is_elapsed(), "{err}");
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

/// A provider that answers every request `503` and notes its method and `Idempotency-Key`.
async fn always_busy() -> (String, Arc<Mutex<Vec<(http::Method, Option<String>)>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let noted = seen.clone();
    let app =
        axum::Router::new().fallback(move |method: http::Method, headers: http::HeaderMap| {
            let key = headers
                .get("idempotency-key")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            noted.lock().unwrap().push((method, key));
            async { (http::StatusCode::SERVICE_UNAVAILABLE, "busy") }
        });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}"), seen)
}

fn quick() -> tower_once::retry::backoff::Backoff {
    tower_once::retry::backoff::Backoff::new(
        Duration::from_millis(1),
        1.0,
        Duration::from_millis(1),
    )
    .unwrap()
}

/// As `retry::reqwest` docs and `core::resend::SafeToRetry` say: through `retry::reqwest::Client`, an
/// unkeyed `POST` or `PATCH` is sent once (its `503` is the answer); a `safe_to_retry()` one is
/// retried and carries no key even with key stamping on; a stamped or keyed one is retried with one
/// key on every attempt; a `PUT` is retried without a key.
#[tokio::test]
async fn only_safe_or_keyed_requests_are_retried_and_safe_ones_get_no_key() {
    use tower_once::retry::reqwest::Client;
    let (base, seen) = always_busy().await;
    let plain = Client::builder(reqwest::Client::new())
        .retry(RetryLayer::new().no_budget().backoff(quick()).into_http())
        .build();
    let stamping = Client::builder(reqwest::Client::new())
        .retry(
            RetryLayer::new()
                .no_budget()
                .backoff(quick())
                .into_http()
                .stamp_idempotency_keys(true),
        )
        .build();
    let take = || std::mem::take(&mut *seen.lock().unwrap());

    for response in [
        plain
            .post(format!("{base}/c"))
            .json(&1)
            .send()
            .await
            .unwrap(),
        plain
            .patch(format!("{base}/c"))
            .json(&1)
            .send()
            .await
            .unwrap(),
    ] {
        assert_eq!(response.status(), 503);
    }
    let once = take();
    assert_eq!(once.len(), 2, "one request each: {once:?}");
    assert!(once.iter().all(|(_, key)| key.is_none()));

    let safe = stamping
        .post(format!("{base}/complete"))
        .json(&"hello")
        .safe_to_retry()
        .send()
        .await
        .unwrap();
    assert_eq!(safe.status(), 503);
    let safe = take();
    assert_eq!(safe.len(), 4, "retried: {safe:?}");
    assert!(
        safe.iter().all(|(_, key)| key.is_none()),
        "no key: {safe:?}"
    );

    let stamped = stamping.patch(format!("{base}/c")).json(&1).send().await;
    assert_eq!(stamped.unwrap().status(), 503);
    let stamped = take();
    assert_eq!(stamped.len(), 4, "{stamped:?}");
    assert!(stamped[0].1.is_some() && stamped.iter().all(|(_, k)| *k == stamped[0].1));

    let keyed = plain
        .post(format!("{base}/c"))
        .idempotency_key("order-77")
        .json(&1)
        .send()
        .await;
    assert_eq!(keyed.unwrap().status(), 503);
    let keyed = take();
    assert_eq!(keyed.len(), 4);
    assert!(keyed.iter().all(|(_, k)| k.as_deref() == Some("order-77")));

    let put = plain.put(format!("{base}/c")).json(&1).send().await;
    assert_eq!(put.unwrap().status(), 503);
    let put = take();
    assert_eq!(put.len(), 4);
    assert!(put
        .iter()
        .all(|(m, k)| *m == http::Method::PUT && k.is_none()));
}

/// The client's error keeps reqwest's: a connection refused on every attempt of a `GET`
/// is `reqwest().is_connect()`, with its attempts in the error and its text; and clones of one
/// client share its retry budget (3 retries per 3 s here): once one clone has spent it, another
/// clone's request on another task is not retried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_keep_reqwests_and_clones_share_the_budget() {
    use tower_once::retry::budget::RetryBudget;
    use tower_once::retry::reqwest::Client;
    let refused = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    }; // closed again: nothing listens there
    let client = Client::builder(reqwest::Client::new())
        .retry(RetryLayer::new().no_budget().backoff(quick()).into_http())
        .build();
    let err = client
        .get(format!("http://{refused}/x"))
        .send()
        .await
        .unwrap_err();
    assert!(
        err.reqwest().is_some_and(reqwest::Error::is_connect),
        "{err:?}"
    );
    assert_eq!(err.attempts(), 4);
    assert!(err.to_string().contains("4 attempts"), "{err}");
    assert!(!err.is_deadline() && !err.may_have_executed(), "{err}");

    let (base, seen) = always_busy().await;
    let shared = Client::builder(reqwest::Client::new())
        .retry(
            RetryLayer::new()
                .budget(RetryBudget::new(0.0, 1, Duration::from_secs(3)))
                .backoff(quick())
                .into_http(),
        )
        .build();
    let first = shared.clone();
    let url = format!("{base}/report");
    let r = first.get(&url).send().await.unwrap();
    assert_eq!(r.status(), 503);
    assert_eq!(seen.lock().unwrap().len(), 4, "3 retries: the budget");
    let second = shared.clone();
    let url2 = url.clone();
    let r = tokio::spawn(async move { second.get(&url2).send().await })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(r.status(), 503);
    assert_eq!(
        seen.lock().unwrap().len(),
        5,
        "the other clone found the budget spent: one request"
    );
}
