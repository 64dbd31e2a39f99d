//! Which answers are stored (idempotency crate docs "What happens to a request": a handler's 400,
//! 413, 415 or 422, axum's own rejections included, releases the key, so the fixed resend runs it),
//! with axum's extractors and `DefaultBodyLimit` in front of the handler. Every test counts handler
//! runs.

use axum::extract::DefaultBodyLimit;
use axum::routing;
use axum::{Json, Router};
use http::StatusCode;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use tower_once_idempotency::IdempotencyLayer;

mod support;

use support::{post_with, send};

#[derive(serde::Deserialize)]
#[allow(dead_code)]
struct Charge {
    amount: u64,
}

fn app(runs: Arc<AtomicUsize>) -> Router {
    Router::new()
        .route(
            "/charges",
            routing::post(move |Json(_c): Json<Charge>| {
                runs.fetch_add(1, SeqCst);
                async { StatusCode::CREATED }
            }),
        )
        .layer(DefaultBodyLimit::max(64))
        .layer(IdempotencyLayer::new())
}

/// A `POST` of `body` keyed `k`, with this `Content-Type` if any: (status, content type, body).
async fn charge(
    app: &Router,
    content_type: Option<&str>,
    body: &str,
) -> (StatusCode, String, String) {
    let mut headers = vec![("idempotency-key", "k")];
    if let Some(ct) = content_type {
        headers.push(("content-type", ct));
    }
    let answer = send(app, post_with("/charges", &headers, body)).await;
    let ct = answer
        .headers
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    (answer.status, ct, answer.text())
}

/// 415 (no Content-Type), 400 (bad JSON) and 422 (JSON of the wrong shape) are not
/// stored; the fixed resend with the same key runs once, and the layer's own 422 (the key
/// reused with another body afterwards) is a problem document with its own type.
#[tokio::test]
async fn axum_rejections_release_and_the_layers_own_422_is_distinct() {
    let runs = Arc::new(AtomicUsize::new(0));
    let app = app(runs.clone());
    let json = Some("application/json");
    assert_eq!(
        charge(&app, None, r#"{"amount":5}"#).await.0,
        StatusCode::UNSUPPORTED_MEDIA_TYPE
    );
    assert_eq!(
        charge(&app, json, r#"{"amount":"#).await.0,
        StatusCode::BAD_REQUEST
    );
    let (s, ct, _) = charge(&app, json, r#"{"amt":5}"#).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(!ct.contains("problem+json"));
    assert_eq!(
        charge(&app, json, r#"{"amount":5}"#).await.0,
        StatusCode::CREATED
    );
    assert_eq!(runs.load(SeqCst), 1);
    let (s, ct, body) = charge(&app, json, r#"{"amount":6}"#).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(
        ct.contains("problem+json") && body.contains("fingerprint-mismatch"),
        "{body}"
    );
    assert_eq!(runs.load(SeqCst), 1);
}

/// axum's own 413 from a route's `DefaultBodyLimit` (smaller than the layer's 1 MiB) is a framework
/// rejection made before the handler runs, exactly like 415: it is not stored, and the client that
/// fixes its request (a smaller body) and resends with the same key runs the handler. Was broken:
/// the 413 was stored, and the fixed resend got the layer's 422 fingerprint mismatch for the whole
/// retention.
#[tokio::test]
async fn axums_own_413_is_released_and_the_fixed_resend_runs() {
    let runs = Arc::new(AtomicUsize::new(0));
    let app = app(runs.clone());
    let json = Some("application/json");
    let big = format!(r#"{{"amount":5,"memo":"{}"}}"#, "x".repeat(200));
    assert_eq!(
        charge(&app, json, &big).await.0,
        StatusCode::PAYLOAD_TOO_LARGE
    );
    let (s, _, body) = charge(&app, json, r#"{"amount":5}"#).await;
    assert_eq!(
        (s, runs.load(SeqCst)),
        (StatusCode::CREATED, 1),
        "the fixed resend was refused: {body}"
    );
}
