//! Which requests are covered and what their keys must be (crate docs "What happens to a
//! request", step 1, and the row "missing key with `require_key`, malformed key": `400`):
//! uncovered methods and keyless requests pass through untouched, a key's quoted and bare forms
//! are one key, and a missing (when required), malformed or repeated key is refused before the
//! handler runs. Paused time; every test counts handler runs.

use http::{HeaderValue, Request, StatusCode};
use http_body_util::Full;
use tower::Layer;
use tower_once_idempotency::IdempotencyLayer;

mod support;

use support::{post, send, Handler};

#[tokio::test(start_paused = true)]
async fn quoted_and_bare_forms_of_a_key_are_the_same_key() {
    let handler = Handler::default();
    let svc = IdempotencyLayer::new().layer(handler.clone());
    send(&svc, post("/c", Some("abc"), "x")).await;
    let again = send(&svc, post("/c", Some("\"abc\""), "x")).await;
    assert!(again.replayed());
    assert_eq!(handler.runs(), 1);
}

#[tokio::test(start_paused = true)]
async fn uncovered_methods_and_keyless_requests_pass_through() {
    let handler = Handler::default();
    let svc = IdempotencyLayer::new().layer(handler.clone());
    for _ in 0..2 {
        let get = Request::get("/c")
            .header("idempotency-key", "k")
            .body(Full::default())
            .unwrap();
        let res = send(&svc, get).await;
        assert!(!res.replayed());
        assert!(
            res.headers.contains_key("connection"),
            "passed through untouched"
        );
        send(&svc, post("/c", None, "x")).await;
    }
    assert_eq!(handler.runs(), 4);
    assert!(svc.store_ref().is_empty(), "nothing was recorded");

    let put_covered = IdempotencyLayer::new()
        .methods([http::Method::PUT])
        .layer(handler.clone());
    let put = || {
        Request::put("/c")
            .header("idempotency-key", "k")
            .body(Full::default())
            .unwrap()
    };
    send(&put_covered, put()).await;
    assert!(send(&put_covered, put()).await.replayed());
    assert_eq!(handler.runs(), 5);
}

#[tokio::test(start_paused = true)]
async fn required_missing_and_invalid_keys_are_400() {
    let handler = Handler::default();
    let svc = IdempotencyLayer::new()
        .require_key(true)
        .layer(handler.clone());
    let missing = send(&svc, post("/c", None, "x")).await;
    assert_eq!(missing.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        missing.problem_type(),
        "urn:tower-once:idempotency:missing-key"
    );

    for bad in ["", "a b", "\"open", &"k".repeat(256)] {
        let res = send(&svc, post("/c", Some(bad), "x")).await;
        assert_eq!(res.status, StatusCode::BAD_REQUEST, "{bad:?}");
        assert_eq!(res.problem_type(), "urn:tower-once:idempotency:invalid-key");
    }
    let mut twice = post("/c", Some("a"), "x");
    twice
        .headers_mut()
        .append("idempotency-key", HeaderValue::from_static("b"));
    let res = send(&svc, twice).await;
    assert_eq!(res.problem_type(), "urn:tower-once:idempotency:invalid-key");
    assert_eq!(handler.runs(), 0);
    assert!(svc.store_ref().is_empty());
}
