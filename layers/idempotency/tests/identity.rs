//! Record identity behind axum routing (idempotency crate docs "What happens to a request": the
//! same key to another method or path, as the client addressed it, prefix of an axum `nest`
//! included, is a separate record; crate docs: a record belongs to the path the client addressed):
//! path spellings axum routes to one resource share one record, and every router shape (nest inside
//! nest, `nest_service`, a fallback service, `merge`, the layer outside the router) keeps resources
//! apart. Every test counts handler runs.

use axum::extract::Path;
use axum::routing;
use axum::Router;
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Full;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tower::{Service, ServiceBuilder};
use tower_once_idempotency::store::MemoryStore;
use tower_once_idempotency::IdempotencyLayer;

mod support;

use support::{post, send};

/// Counts handler runs per decoded account id.
#[derive(Clone, Default)]
struct Runs(Arc<Mutex<HashMap<String, usize>>>);

impl Runs {
    fn total(&self) -> usize {
        self.0.lock().unwrap().values().sum()
    }
    fn of(&self, id: &str) -> usize {
        self.0.lock().unwrap().get(id).copied().unwrap_or(0)
    }
}

fn charges(runs: Runs) -> axum::routing::MethodRouter {
    routing::post(move |Path(params): Path<HashMap<String, String>>| {
        let id = params.get("id").cloned().unwrap_or_default();
        *runs.0.lock().unwrap().entry(id.clone()).or_default() += 1;
        async move { (StatusCode::CREATED, id) }
    })
}

/// A keyed `POST` of `{}` to `path`: (status, replayed, body).
async fn charge<S, B>(app: &S, path: &str, key: &str) -> (StatusCode, bool, String)
where
    S: Service<Request<Full<Bytes>>, Response = http::Response<B>> + Clone,
    S::Error: std::fmt::Debug,
    B: axum::body::HttpBody<Data = bytes::Bytes>,
    B::Error: std::fmt::Debug,
{
    let answer = send(app, post(path, Some(key), "{}")).await;
    (answer.status, answer.replayed(), answer.text())
}

/// axum routes `/accounts/%61/charges` to the same handler as `/accounts/a/charges` (the `Path`
/// extractor percent-decodes `%61` to `a`): it is the same resource, so the same key and body share
/// one record and charge account `a` once. Was broken: the record identity hashed the raw
/// `OriginalUri` path (store/mod.rs `addressed_path`), so they charged it twice.
#[tokio::test]
async fn a_percent_encoded_path_is_the_same_resource_and_the_same_record() {
    let runs = Runs::default();
    let api = Router::new()
        .route("/charges", charges(runs.clone()))
        .layer(IdempotencyLayer::with_store(MemoryStore::new()));
    let app = Router::new().nest("/accounts/{id}", api);
    let (s1, r1, b1) = charge(&app, "/accounts/a/charges", "k").await;
    let (s2, r2, b2) = charge(&app, "/accounts/%61/charges", "k").await;
    assert_eq!((s1, b1.as_str(), r1), (StatusCode::CREATED, "a", false));
    assert_eq!(b2, "a", "axum routed both to account a");
    assert_eq!(
        (runs.of("a"), s2, r2),
        (1, StatusCode::CREATED, true),
        "the same key on the same resource ran the charge twice"
    );
}

/// The same without `nest` (a plain route with the layer): when axum routes both spellings, they
/// share one record. Was broken as with `nest`.
#[tokio::test]
async fn a_percent_encoded_path_without_nest_is_a_separate_record_too() {
    let runs = Runs::default();
    let app = Router::new()
        .route("/accounts/{id}/charges", charges(runs.clone()))
        .layer(IdempotencyLayer::with_store(MemoryStore::new()));
    charge(&app, "/accounts/ab/charges", "k").await;
    charge(&app, "/accounts/a%62/charges", "k").await;
    charge(&app, "/accounts/%61%62/charges", "k").await;
    assert_eq!(
        runs.of("ab"),
        1,
        "one key, one resource: handler runs = {}",
        runs.of("ab")
    );
}

/// Trailing slash. Reports whether axum routes `/payments/` to the nested
/// `/payments` root; if it does, the two must share a record.
#[tokio::test]
async fn trailing_slash_variant() {
    let runs = Runs::default();
    let app = Router::new().nest(
        "/payments",
        Router::new()
            .route("/", charges(runs.clone()))
            .layer(IdempotencyLayer::new()),
    );
    let (a, _, _) = charge(&app, "/payments", "k").await;
    let (b, replayed, _) = charge(&app, "/payments/", "k").await;
    eprintln!("/payments -> {a}, /payments/ -> {b} (replayed: {replayed})");
    if a.is_success() && b.is_success() {
        assert!(
            replayed,
            "axum routed both spellings to one handler, which ran twice"
        );
    }
    assert!(runs.total() <= 1 || !b.is_success() || !a.is_success());
}

/// Checks that two resources never share a record and that each one's retry is replayed.
async fn separate<S, B>(app: S, a: &str, b: &str, runs: &Runs)
where
    S: Service<Request<Full<Bytes>>, Response = http::Response<B>> + Clone,
    S::Error: std::fmt::Debug,
    B: axum::body::HttpBody<Data = bytes::Bytes>,
    B::Error: std::fmt::Debug,
{
    let (sa, ra, _) = charge(&app, a, "k").await;
    let (sb, rb, _) = charge(&app, b, "k").await;
    assert_eq!(
        (sa, sb),
        (StatusCode::CREATED, StatusCode::CREATED),
        "{a} / {b}"
    );
    assert!(!ra && !rb, "{b} was answered with {a}'s record");
    assert_eq!(runs.total(), 2);
    let (_, again, _) = charge(&app, b, "k").await;
    assert!(again, "{b}'s retry is replayed");
    assert_eq!(runs.total(), 2);
}

/// Nest inside nest, the layer on the innermost router.
#[tokio::test]
async fn nest_inside_nest() {
    let runs = Runs::default();
    let api = Router::new()
        .route("/charges", charges(runs.clone()))
        .layer(IdempotencyLayer::with_store(MemoryStore::new()));
    let app = Router::new().nest("/orgs/{org}", Router::new().nest("/accounts/{id}", api));
    separate(
        app,
        "/orgs/x/accounts/a/charges",
        "/orgs/y/accounts/a/charges",
        &runs,
    )
    .await;
}

/// `nest_service` with two prefixes sharing one store.
#[tokio::test]
async fn nest_service_sharing_a_store() {
    let runs = Runs::default();
    let layer = IdempotencyLayer::with_store(MemoryStore::new());
    let inner = |runs: Runs| {
        Router::new()
            .route("/accounts/{id}/charges", charges(runs))
            .layer(layer.clone())
    };
    let app = Router::new()
        .nest_service("/v1", inner(runs.clone()))
        .nest_service("/v2", inner(runs.clone()));
    separate(
        app,
        "/v1/accounts/a/charges",
        "/v2/accounts/a/charges",
        &runs,
    )
    .await;
}

/// A layered Router used as a fallback service of a nested router, and `merge`.
#[tokio::test]
async fn fallback_service_and_merge() {
    let runs = Runs::default();
    let layer = IdempotencyLayer::with_store(MemoryStore::new());
    let fallback = Router::new()
        .route("/accounts/{id}/charges", charges(runs.clone()))
        .layer(layer.clone());
    let nested = Router::new().fallback_service(fallback);
    let merged = Router::new()
        .route("/accounts/{id}/refunds", charges(runs.clone()))
        .layer(layer);
    let app = Router::new()
        .nest("/t1", nested.clone())
        .nest("/t2", nested)
        .merge(merged);
    separate(
        app,
        "/t1/accounts/a/charges",
        "/t2/accounts/a/charges",
        &runs,
    )
    .await;
}

/// The layer outside the Router (ServiceBuilder), where axum has not set OriginalUri.
#[tokio::test]
async fn service_builder_outside_the_router() {
    let runs = Runs::default();
    let router = Router::new().nest(
        "/accounts/{id}",
        Router::new().route("/charges", charges(runs.clone())),
    );
    let app = ServiceBuilder::new()
        .layer(IdempotencyLayer::new())
        .service(router);
    separate(app, "/accounts/a/charges", "/accounts/b/charges", &runs).await;
}
