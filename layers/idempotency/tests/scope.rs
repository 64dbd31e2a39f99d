//! Scopes fail closed (idempotency crate docs "What happens to a request": "Scopes fail closed";
//! crate docs, "What happens to a request", step 2; the `scope` module): a keyed request whose
//! scope names no tenant is refused with `401` (`…:missing-scope`) before its handler runs, and no
//! record is ever shared between tenants, whatever order the layers are in and whatever the
//! router's shape (`nest`, `merge`, `route_layer`, an auth layer that sets the tenant only for some
//! requests), in process and over HTTP/1 and HTTP/2 from a hyper-util client to `axum::serve` on
//! loopback. Every test counts handler runs.

mod support;

use axum::extract::{Extension, Request};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing;
use axum::Router;
use bytes::Bytes;
use http::request::Parts;
use http::StatusCode;
use http_body_util::Full;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use support::{post, post_with, send, serve, Answer, Handler};
use tower::{Layer, ServiceExt};
use tower_once_idempotency::scope::HeaderScope;
use tower_once_idempotency::store::MemoryStore;
use tower_once_idempotency::IdempotencyLayer;

#[derive(Debug, Clone)]
struct Tenant(String);

/// A `POST` of `body` to `/charges` with these headers.
async fn charge(app: &Router, headers: &[(&str, &str)], body: &str) -> Answer {
    send(app, post_with("/charges", headers, body)).await
}

/// A charge handler that names the tenant it charged (from the auth layer's extension, or
/// the header) and counts its runs.
fn charges(runs: Arc<AtomicUsize>) -> Router {
    Router::new().route(
        "/charges",
        routing::post(move |tenant: Option<Extension<Tenant>>, body: String| {
            runs.fetch_add(1, SeqCst);
            let tenant = tenant.map_or_else(|| "-".to_owned(), |t| t.0 .0);
            async move { (StatusCode::CREATED, format!("charged {tenant}: {body}")) }
        }),
    )
}

/// A stand-in for authentication: `Authorization: Bearer <tenant>` becomes a `Tenant`; other
/// requests go on without one (the conditional auth of an API with public routes).
async fn authenticate(mut req: Request, next: Next) -> Response {
    let tenant = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_owned);
    if let Some(tenant) = tenant {
        req.extensions_mut().insert(Tenant(tenant));
    }
    next.run(req).await
}

fn tenant_scope(parts: &Parts) -> Option<String> {
    parts.extensions.get::<Tenant>().map(|t| t.0.clone())
}

#[tokio::test(start_paused = true)]
async fn auth_inside_the_layer_refuses_every_keyed_request_and_shares_nothing() {
    // The mistake: with axum the last `.layer` is the outermost, so here the idempotency layer
    // runs first and the tenant is not known yet when it scopes the key.
    let runs = Arc::new(AtomicUsize::new(0));
    let wrong = charges(runs.clone())
        .layer(middleware::from_fn(authenticate))
        .layer(
            IdempotencyLayer::new()
                .require_key(true)
                .scope(tenant_scope),
        );
    for tenant in ["Bearer acme", "Bearer globex", "Bearer acme"] {
        let answer = charge(
            &wrong,
            &[("authorization", tenant), ("idempotency-key", "pay-1")],
            "500",
        )
        .await;
        assert_eq!(answer.status, StatusCode::UNAUTHORIZED, "{}", answer.text());
        assert_eq!(
            answer.problem_type(),
            "urn:tower-once:idempotency:missing-scope"
        );
        assert!(!answer.replayed());
    }
    assert_eq!(runs.load(SeqCst), 0, "no handler ran without a scope");

    // The right order: each tenant is charged once and replays only its own record.
    let runs = Arc::new(AtomicUsize::new(0));
    let right = charges(runs.clone())
        .layer(
            IdempotencyLayer::new()
                .require_key(true)
                .scope(tenant_scope),
        )
        .layer(middleware::from_fn(authenticate));
    let acme = [
        ("authorization", "Bearer acme"),
        ("idempotency-key", "pay-1"),
    ];
    let globex = [
        ("authorization", "Bearer globex"),
        ("idempotency-key", "pay-1"),
    ];
    let a = charge(&right, &acme, "500").await;
    let b = charge(&right, &globex, "500").await;
    let a_again = charge(&right, &acme, "500").await;
    assert_eq!((a.status, a.replayed()), (StatusCode::CREATED, false));
    assert_eq!((b.status, b.replayed()), (StatusCode::CREATED, false));
    assert_eq!(a.body, "charged acme: 500");
    assert_eq!(b.body, "charged globex: 500", "never acme's stored payment");
    assert!(a_again.replayed());
    assert_eq!(a_again.body, a.body);
    assert_eq!(runs.load(SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn a_header_scope_refuses_a_keyed_request_without_its_header() {
    let runs = Arc::new(AtomicUsize::new(0));
    let app =
        charges(runs.clone()).layer(IdempotencyLayer::new().scope(HeaderScope::new("x-tenant-id")));
    let missing = charge(&app, &[("idempotency-key", "k")], "1").await;
    let empty = charge(&app, &[("idempotency-key", "k"), ("x-tenant-id", "")], "1").await;
    for answer in [&missing, &empty] {
        assert_eq!(answer.status, StatusCode::UNAUTHORIZED);
        assert_eq!(
            answer.problem_type(),
            "urn:tower-once:idempotency:missing-scope"
        );
    }
    assert_eq!(runs.load(SeqCst), 0);
    // Named tenants are scoped; a request without a key is not scoped at all (passes through).
    let a = charge(&app, &[("idempotency-key", "k"), ("x-tenant-id", "a")], "1").await;
    let keyless = charge(&app, &[], "1").await;
    assert_eq!(a.status, StatusCode::CREATED);
    assert_eq!(keyless.status, StatusCode::CREATED);
    assert_eq!(runs.load(SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn allow_missing_shares_one_scope_that_is_never_a_tenants() {
    let runs = Arc::new(AtomicUsize::new(0));
    let app = charges(runs.clone())
        .layer(IdempotencyLayer::new().scope(HeaderScope::new("x-tenant-id").allow_missing()));
    let first = charge(&app, &[("idempotency-key", "k")], "1").await;
    let again = charge(&app, &[("idempotency-key", "k"), ("x-tenant-id", "")], "1").await;
    let tenant = charge(&app, &[("idempotency-key", "k"), ("x-tenant-id", "t")], "1").await;
    assert_eq!(
        (first.status, first.replayed()),
        (StatusCode::CREATED, false)
    );
    assert!(
        again.replayed(),
        "missing and empty share the anonymous scope"
    );
    assert_eq!(
        (tenant.status, tenant.replayed()),
        (StatusCode::CREATED, false),
        "a named tenant never gets the anonymous scope's record"
    );
    assert_eq!(runs.load(SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn grpc_clients_without_a_scope_get_unauthenticated() {
    let runs = Arc::new(AtomicUsize::new(0));
    let app =
        charges(runs.clone()).layer(IdempotencyLayer::new().scope(HeaderScope::new("x-tenant-id")));
    let answer = charge(
        &app,
        &[
            ("idempotency-key", "k"),
            ("content-type", "application/grpc"),
        ],
        "",
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(runs.load(SeqCst), 0);
    let req = http::Request::post("/charges")
        .header("idempotency-key", "k")
        .header("content-type", "application/grpc")
        .body(axum::body::Body::empty())
        .unwrap();
    let res = app.oneshot(req).await.unwrap();
    assert_eq!(res.headers()["grpc-status"], "16");
}

/// A gateway in front of the service that authenticates the caller and *appends* its tenant
/// header (Envoy's `request_headers_to_add` appends by default): a header the client sent
/// itself stays in front. The handler charges the authenticated tenant.
async fn appending_gateway(mut req: Request, next: Next) -> Response {
    let tenant = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_owned);
    if let Some(tenant) = tenant {
        if let Ok(value) = http::HeaderValue::from_str(&tenant) {
            req.headers_mut().append("x-tenant-id", value);
        }
        req.extensions_mut().insert(Tenant(tenant));
    }
    next.run(req).await
}

/// A `HeaderScope` header sent twice never reaches another tenant's record: like the key header
/// sent twice (`400`), a scope that cannot tell whose request it is fails closed (scope module,
/// crate docs step 2: "One tenant can never read or block another tenant's key"). Was broken: the
/// scope took the first of several tenant headers, so a client that sent another tenant's id in
/// front of the one its gateway adds was scoped as that tenant and got its stored payment back.
#[tokio::test(start_paused = true)]
async fn a_tenant_header_sent_twice_never_reaches_another_tenants_record() {
    let runs = Arc::new(AtomicUsize::new(0));
    let app = charges(runs.clone())
        .layer(
            IdempotencyLayer::new()
                .require_key(true)
                .scope(HeaderScope::new("x-tenant-id")),
        )
        .layer(middleware::from_fn(appending_gateway));
    let acme = charge(
        &app,
        &[
            ("authorization", "Bearer acme"),
            ("idempotency-key", "pay-1"),
        ],
        "500",
    )
    .await;
    assert_eq!((acme.status, acme.replayed()), (StatusCode::CREATED, false));
    assert_eq!(runs.load(SeqCst), 1);

    // globex, authenticated as globex, puts acme's id in front of the gateway's header.
    let globex = charge(
        &app,
        &[
            ("authorization", "Bearer globex"),
            ("x-tenant-id", "acme"),
            ("idempotency-key", "pay-1"),
        ],
        "500",
    )
    .await;
    assert!(
        !globex.replayed() && globex.body != acme.body,
        "globex got acme's stored answer: {} {:?}",
        globex.status,
        globex.body
    );
    assert!(runs.load(SeqCst) <= 2);
}

/// `/v1/charges` (nested, `route_layer`, scoped by the auth layer's tenant) and `/refunds`
/// (merged, `layer`, scoped by a gateway's `X-Tenant-Id`), one store for both, the auth layer
/// outermost. Each handler says whom it served and counts its runs.
fn app(charges: Arc<AtomicUsize>, refunds: Arc<AtomicUsize>) -> Router {
    let store = MemoryStore::new();
    let v1 = Router::new()
        .route(
            "/charges",
            routing::post(move |tenant: Option<Extension<Tenant>>, body: String| {
                charges.fetch_add(1, SeqCst);
                let tenant = tenant.map_or_else(|| "-".to_owned(), |t| t.0 .0);
                async move { (StatusCode::CREATED, format!("charged {tenant}: {body}")) }
            }),
        )
        .route_layer(IdempotencyLayer::with_store(store.clone()).scope(
            |parts: &http::request::Parts| parts.extensions.get::<Tenant>().map(|t| t.0.clone()),
        ));
    let other = Router::new()
        .route(
            "/refunds",
            routing::post(move |headers: http::HeaderMap, body: String| {
                refunds.fetch_add(1, SeqCst);
                let tenant = headers
                    .get("x-tenant-id")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("-")
                    .to_owned();
                async move { (StatusCode::CREATED, format!("refunded {tenant}: {body}")) }
            }),
        )
        .layer(IdempotencyLayer::with_store(store).scope(HeaderScope::new("X-Tenant-Id")));
    Router::new()
        .nest("/v1", v1)
        .merge(other)
        .layer(middleware::from_fn(authenticate))
}

async fn post_to(
    client: &Client<HttpConnector, Full<Bytes>>,
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    body: &'static str,
) -> Answer {
    let req = post_with(&format!("http://{addr}{path}"), headers, body);
    Answer::read(client.request(req).await.unwrap()).await
}

/// Over HTTP/1 and HTTP/2, a nested `route_layer` scoped by an outer auth layer and a
/// merged `layer` scoped by a header share one store and never share a record: requests
/// without a tenant (no token; no header; an empty header) are refused before any handler
/// runs; tenants with the same key run their own handlers; a tenant's retry is replayed
/// (header names match whatever their case; header values are tenants as they are, so
/// `Acme` is not `acme`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_tenant_is_refused_and_tenants_never_share_over_http1_and_http2() {
    for http2 in [false, true] {
        let (charges, refunds) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let addr = serve(app(charges.clone(), refunds.clone())).await;
        let client: Client<HttpConnector, Full<Bytes>> = Client::builder(TokioExecutor::new())
            .http2_only(http2)
            .build_http();
        let version = if http2 {
            http::Version::HTTP_2
        } else {
            http::Version::HTTP_11
        };
        let key = ("idempotency-key", "pay-1");

        for refused in [
            post_to(&client, addr, "/v1/charges", &[key], "500").await,
            post_to(&client, addr, "/refunds", &[key], "500").await,
            post_to(
                &client,
                addr,
                "/refunds",
                &[key, ("x-tenant-id", "")],
                "500",
            )
            .await,
        ] {
            assert_eq!(refused.version, version);
            assert_eq!(
                refused.status,
                StatusCode::UNAUTHORIZED,
                "{}",
                refused.text()
            );
            assert_eq!(
                refused.problem_type(),
                "urn:tower-once:idempotency:missing-scope"
            );
        }
        assert_eq!((charges.load(SeqCst), refunds.load(SeqCst)), (0, 0));

        let acme = post_to(
            &client,
            addr,
            "/v1/charges",
            &[key, ("authorization", "Bearer acme")],
            "500",
        )
        .await;
        let globex = post_to(
            &client,
            addr,
            "/v1/charges",
            &[key, ("authorization", "Bearer globex")],
            "500",
        )
        .await;
        let acme_again = post_to(
            &client,
            addr,
            "/v1/charges",
            &[key, ("authorization", "Bearer acme")],
            "500",
        )
        .await;
        assert_eq!(acme.body, "charged acme: 500");
        assert_eq!(
            (globex.status, globex.replayed(), globex.text().as_str()),
            (StatusCode::CREATED, false, "charged globex: 500")
        );
        assert!(acme_again.replayed() && acme_again.body == acme.body);
        assert_eq!(charges.load(SeqCst), 2);

        let upper = post_to(
            &client,
            addr,
            "/refunds",
            &[key, ("X-Tenant-Id", "acme")],
            "9",
        )
        .await;
        let lower = post_to(
            &client,
            addr,
            "/refunds",
            &[key, ("x-tenant-id", "acme")],
            "9",
        )
        .await;
        let other = post_to(
            &client,
            addr,
            "/refunds",
            &[key, ("x-tenant-id", "Acme")],
            "9",
        )
        .await;
        assert_eq!(
            (upper.status, upper.replayed()),
            (StatusCode::CREATED, false)
        );
        assert!(lower.replayed(), "the header's name case does not matter");
        assert_eq!(
            (other.replayed(), other.text().as_str()),
            (false, "refunded Acme: 9"),
            "another tenant id is another tenant"
        );
        assert_eq!(refunds.load(SeqCst), 2);
    }
}

#[tokio::test(start_paused = true)]
async fn tenants_with_the_same_key_are_independent() {
    let handler = Handler::default();
    let svc = IdempotencyLayer::new()
        .scope(HeaderScope::new("x-tenant-id"))
        .layer(handler.clone());
    let as_tenant = |tenant: &str, body: &'static str| {
        let mut req = post("/c", Some("shared-key"), body);
        req.headers_mut()
            .insert("x-tenant-id", tenant.parse().unwrap());
        req
    };
    let a = send(&svc, as_tenant("a", "from a")).await;
    let b = send(&svc, as_tenant("b", "from b")).await;
    assert_eq!(handler.runs(), 2, "each tenant's first request runs");
    assert!(!b.replayed(), "tenant b never sees tenant a's response");
    assert_eq!(send(&svc, as_tenant("a", "from a")).await.body, a.body);
    assert_eq!(send(&svc, as_tenant("b", "from b")).await.body, b.body);
    assert_eq!(handler.runs(), 2);
}
