//! Record identity behind axum's `Router::nest` and `route_layer` (crate docs "What happens to
//! a request": "Behind axum's `Router::nest` the layer identifies a record by the full path the
//! client addressed"): a record belongs to the path the client addressed, not the stripped path a
//! nested router sees.

use axum::extract::Path;
use axum::routing;
use axum::Router;
use http::StatusCode;
use proptest::prelude::*;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use tower_once_idempotency::scope::HeaderScope;
use tower_once_idempotency::store::MemoryStore;
use tower_once_idempotency::IdempotencyLayer;

mod support;

use support::{post, post_with, send};

#[derive(Clone, Default)]
struct Runs(Arc<AtomicUsize>);

impl Runs {
    fn get(&self) -> usize {
        self.0.load(SeqCst)
    }
}

/// An account API, nested under `/accounts/{id}`, with the layer on the nested router.
fn accounts(store: MemoryStore, runs: Runs) -> Router {
    let api = Router::new()
        .route(
            "/charges",
            routing::post(move |body: String| {
                let n = runs.0.fetch_add(1, SeqCst) + 1;
                async move { (StatusCode::CREATED, format!("charge {n}: {body}")) }
            }),
        )
        .layer(IdempotencyLayer::with_store(store).scope(HeaderScope::new("x-tenant")));
    Router::new().nest("/accounts/{id}", api)
}

/// A keyed `POST` of `body` to `path` as `tenant`: (status, replayed, body).
async fn charge(
    app: &Router,
    path: &str,
    tenant: &str,
    key: &str,
    body: &str,
) -> (StatusCode, bool, String) {
    let req = post_with(
        path,
        &[("idempotency-key", key), ("x-tenant", tenant)],
        body,
    );
    let answer = send(app, req).await;
    (answer.status, answer.replayed(), answer.text())
}

#[tokio::test]
async fn another_account_with_the_same_key_and_body_runs_its_own_handler() {
    let runs = Runs::default();
    let app = accounts(MemoryStore::new(), runs.clone());
    let (a, replayed_a, _) = charge(&app, "/accounts/A/charges", "t", "k", "{}").await;
    let (b, replayed_b, _) = charge(&app, "/accounts/B/charges", "t", "k", "{}").await;
    assert_eq!((a, b), (StatusCode::CREATED, StatusCode::CREATED));
    assert!(
        !replayed_a && !replayed_b,
        "B is not answered with A's charge"
    );
    assert_eq!(runs.get(), 2);
    let (_, again, _) = charge(&app, "/accounts/B/charges", "t", "k", "{}").await;
    assert!(again, "B's own retry is replayed");
    assert_eq!(runs.get(), 2);
}

#[tokio::test]
async fn two_nested_routers_sharing_a_store_never_replay_each_other() {
    let store = MemoryStore::new();
    let (payments, refunds) = (Runs::default(), Runs::default());
    let handler = |runs: Runs| {
        routing::post(move || {
            runs.0.fetch_add(1, SeqCst);
            async { StatusCode::CREATED }
        })
    };
    let layer = IdempotencyLayer::with_store(store);
    let app = Router::new()
        .nest(
            "/payments",
            Router::new()
                .route("/", handler(payments.clone()))
                .layer(layer.clone()),
        )
        .nest(
            "/refunds",
            Router::new()
                .route("/", handler(refunds.clone()))
                .layer(layer),
        );
    let (_, r1, _) = charge(&app, "/payments", "t", "k", "{}").await;
    let (_, r2, _) = charge(&app, "/refunds", "t", "k", "{}").await;
    assert!(!r1 && !r2);
    assert_eq!((payments.get(), refunds.get()), (1, 1));
}

#[tokio::test]
async fn route_layer_inside_a_nested_router_uses_the_full_path() {
    let runs = Runs::default();
    let counted = runs.clone();
    let api = Router::new()
        .route(
            "/charges",
            routing::post(move |Path(id): Path<String>| {
                counted.0.fetch_add(1, SeqCst);
                async move { (StatusCode::CREATED, id) }
            }),
        )
        .route_layer(IdempotencyLayer::new());
    let app = Router::new().nest("/accounts/{id}", api);
    let (_, _, a) = charge(&app, "/accounts/A/charges", "t", "k", "{}").await;
    let (_, replayed, b) = charge(&app, "/accounts/B/charges", "t", "k", "{}").await;
    assert_eq!((a.as_str(), b.as_str()), ("A", "B"));
    assert!(!replayed);
    assert_eq!(runs.get(), 2);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Random (scope, account, key, body) requests through a nested router: a request is
    /// replayed only when the same tenant sent the same key to the same account before, and
    /// then only with the same body; otherwise its handler runs.
    #[test]
    fn a_record_is_shared_only_by_the_same_resource_and_key(
        requests in proptest::collection::vec(
            (0..2u8, 0..3u8, 0..2u8, 0..2u8), 1..12,
        )
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let runs = Runs::default();
            let app = accounts(MemoryStore::new(), runs.clone());
            let mut seen = std::collections::HashMap::new();
            let mut expected_runs = 0;
            for (tenant, account, key, body) in requests {
                let path = format!("/accounts/{account}/charges");
                let (tenant, key, body) = (format!("t{tenant}"), format!("k{key}"), format!("b{body}"));
                let (status, replayed, _) = charge(&app, &path, &tenant, &key, &body).await;
                match seen.get(&(tenant.clone(), account, key.clone())) {
                    None => {
                        expected_runs += 1;
                        prop_assert_eq!(status, StatusCode::CREATED);
                        prop_assert!(!replayed);
                        seen.insert((tenant, account, key), body);
                    }
                    Some(first) if *first == body => {
                        prop_assert!(replayed);
                    }
                    Some(_) => prop_assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY),
                }
                prop_assert_eq!(runs.get(), expected_runs);
            }
            Ok(())
        })?;
    }
}

/// The charge API nested under `/accounts/{id}` and `/v2/accounts/{id}`, with the layer
/// outside the whole `Router` (a `tower::Layer` around it), one store; and a sender of keyed
/// POSTs to it that returns (status, replayed, body).
type Answer = (StatusCode, bool, String);
type Sent = std::pin::Pin<Box<dyn std::future::Future<Output = Answer>>>;

fn outside_the_router(runs: Runs) -> impl Fn(&'static str) -> Sent {
    use tower::Layer;
    let charge = move |Path(id): Path<String>| {
        let n = runs.0.fetch_add(1, SeqCst) + 1;
        async move { (StatusCode::CREATED, format!("charge {n} of {id}")) }
    };
    let api = Router::new().route("/charges", routing::post(charge));
    let router = Router::new()
        .nest("/accounts/{id}", api.clone())
        .nest("/v2/accounts/{id}", api);
    let outside = IdempotencyLayer::with_store(MemoryStore::new()).layer(router);
    move |path| {
        let svc = outside.clone();
        Box::pin(async move {
            let answer = send(&svc, post(path, Some("k"), "{}")).await;
            (answer.status, answer.replayed(), answer.text())
        })
    }
}

/// With the layer outside the whole `Router`, nested routers under `/accounts/{id}` and
/// `/v2/accounts/{id}` sharing one store: a record belongs to the path the client addressed.
/// Another account, another prefix, or a trailing slash the router does not route never get
/// the record; the same account's retry is replayed.
#[tokio::test]
async fn identity_follows_the_addressed_path_with_the_layer_outside_the_router() {
    let runs = Runs::default();
    let send = outside_the_router(runs.clone());
    let a = send("/accounts/A/charges").await;
    let b = send("/accounts/B/charges").await;
    let v2 = send("/v2/accounts/A/charges").await;
    let slash = send("/accounts/A/charges/").await;
    let again = send("/accounts/A/charges").await;
    assert_eq!(a, (StatusCode::CREATED, false, "charge 1 of A".to_owned()));
    assert_eq!(b, (StatusCode::CREATED, false, "charge 2 of B".to_owned()));
    assert_eq!(v2, (StatusCode::CREATED, false, "charge 3 of A".to_owned()));
    assert_eq!(
        (slash.0, slash.1),
        (StatusCode::NOT_FOUND, false),
        "no route, and never A's record"
    );
    assert_eq!(
        again,
        (StatusCode::CREATED, true, "charge 1 of A".to_owned())
    );
    assert_eq!(runs.get(), 3);
}

/// The same request to `/accounts/%41/charges` after `/accounts/A/charges` is a retry of it and is
/// replayed, not refused: only "other query or body" is `422` (the crate docs' table), and the
/// record's identity treats an escaped unreserved character as the character (store/key.rs,
/// `normalize_path`), so its fingerprint does too. Was broken: the fingerprint hashed the raw path,
/// so the retry found A's record and was refused `422` "used with a different request".
#[tokio::test]
async fn a_retry_with_an_escaped_path_is_replayed_not_refused() {
    let runs = Runs::default();
    let send = outside_the_router(runs.clone());
    let a = send("/accounts/A/charges").await;
    let escaped = send("/accounts/%41/charges").await;
    assert_eq!(a, (StatusCode::CREATED, false, "charge 1 of A".to_owned()));
    assert_eq!(runs.get(), 1, "the handler ran once");
    assert_eq!(
        escaped,
        (StatusCode::CREATED, true, "charge 1 of A".to_owned()),
        "%41 is A: the same account's retry"
    );
}
