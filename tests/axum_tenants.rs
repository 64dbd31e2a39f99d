//! The axum tenants example (examples/README.md: keys scoped by the tenant an auth layer put
//! in the request extensions, records in Redis, the layer's errors in the API's own format) against
//! a real Redis: per-tenant keys, auth before idempotency, the API's own error format.
#![cfg(feature = "redis")]

#[allow(dead_code)]
#[path = "../examples/axum_tenants.rs"]
mod example;

use axum::body::Body;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use tower::ServiceExt;
use tower_once::idempotency::store::redis::RedisStore;
use tower_once_test_support::redis::RedisServer;

async fn post(
    app: &axum::Router,
    tenant: Option<&str>,
    key: Option<&str>,
    body: &'static str,
) -> (StatusCode, serde_json::Value, bool) {
    let mut req = Request::post("/orders");
    if let Some(tenant) = tenant {
        req = req.header("authorization", format!("Bearer {tenant}"));
    }
    if let Some(key) = key {
        req = req.header("idempotency-key", key);
    }
    let res = app
        .clone()
        .oneshot(req.body(Body::from(body)).unwrap())
        .await
        .unwrap();
    let status = res.status();
    let replayed = res.headers().contains_key("idempotent-replayed");
    let bytes = res.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap(), replayed)
}

#[tokio::test]
async fn tenants_share_key_strings_but_never_records() {
    let redis = RedisServer::start();
    let app = example::app(RedisStore::connect(&redis.url()).await.unwrap());

    let (status, acme, _) = post(&app, Some("acme"), Some("k1"), "two widgets").await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, globex, replayed) = post(&app, Some("globex"), Some("k1"), "two widgets").await;
    assert_eq!(status, StatusCode::CREATED);
    assert!(!replayed, "globex's k1 is not acme's k1");
    assert_ne!(acme["id"], globex["id"]);
    assert_eq!(globex["tenant"], "globex");

    let (_, again, replayed) = post(&app, Some("acme"), Some("k1"), "two widgets").await;
    assert!(replayed);
    assert_eq!(again, acme, "acme's retry replays acme's order");
    let keys = redis.cli(&["DBSIZE"]);
    assert_eq!(keys.trim(), "2", "one record per tenant");
}

#[tokio::test]
async fn auth_runs_first_and_errors_use_the_api_format() {
    let redis = RedisServer::start();
    let app = example::app(RedisStore::connect(&redis.url()).await.unwrap());

    let (status, body, _) = post(&app, None, Some("k1"), "x").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(body["error"]["code"], "unauthenticated");
    assert_eq!(
        redis.cli(&["DBSIZE"]).trim(),
        "0",
        "nothing was claimed for an unauthenticated call"
    );

    let (status, body, _) = post(&app, Some("acme"), None, "x").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(
        body["error"]["code"], "missing-key",
        "the idempotency layer speaks the API's format"
    );

    post(&app, Some("acme"), Some("k2"), "one gadget").await;
    let (status, body, _) = post(&app, Some("acme"), Some("k2"), "five gadgets").await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(body["error"]["code"], "fingerprint-mismatch");
    assert_eq!(body["error"]["message"], "Idempotency-Key reused");
}
