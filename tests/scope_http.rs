//! Scopes fail closed, over real servers (README "What the idempotency layer answers": "Scopes
//! fail closed"; the idempotency crate's `scope` module): a keyed request whose scope names no
//! tenant is refused with `401` (`…:missing-scope`) before its handler runs, and no record is
//! shared across tenants, whatever the router's shape (`nest`, `merge`, `route_layer`, an auth
//! layer that sets the tenant only for some requests), over HTTP/1 and HTTP/2 from a
//! hyper-util client to `axum::serve` on loopback. Every test counts handler runs.

use axum::extract::{Extension, Request};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::post;
use axum::Router;
use bytes::Bytes;
use http::StatusCode;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use tower_once::idempotency::scope::HeaderScope;
use tower_once::idempotency::store::MemoryStore;
use tower_once::idempotency::IdempotencyLayer;

#[derive(Debug, Clone)]
struct Tenant(String);

/// `Authorization: Bearer <tenant>` becomes a `Tenant`; other requests go on without one (the
/// conditional auth of an API with public routes).
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

/// `/v1/charges` (nested, `route_layer`, scoped by the auth layer's tenant) and `/refunds`
/// (merged, `layer`, scoped by a gateway's `X-Tenant-Id`), one store for both, the auth layer
/// outermost. Each handler says whom it served and counts its runs.
fn app(charges: Arc<AtomicUsize>, refunds: Arc<AtomicUsize>) -> Router {
    let store = MemoryStore::new();
    let v1 = Router::new()
        .route(
            "/charges",
            post(move |tenant: Option<Extension<Tenant>>, body: String| {
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
            post(move |headers: http::HeaderMap, body: String| {
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

async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

struct Answer {
    status: StatusCode,
    replayed: bool,
    version: http::Version,
    body: String,
}

impl Answer {
    fn problem_type(&self) -> String {
        serde_json::from_str::<serde_json::Value>(&self.body)
            .ok()
            .and_then(|v| v["type"].as_str().map(str::to_owned))
            .unwrap_or_default()
    }
}

async fn post_to(
    client: &Client<HttpConnector, Full<Bytes>>,
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    body: &'static str,
) -> Answer {
    let mut req = http::Request::post(format!("http://{addr}{path}"));
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    let res = client
        .request(
            req.body(Full::new(Bytes::from_static(body.as_bytes())))
                .unwrap(),
        )
        .await
        .unwrap();
    let (status, version) = (res.status(), res.version());
    let replayed = res.headers().contains_key("idempotent-replayed");
    let body = res.into_body().collect().await.unwrap().to_bytes();
    Answer {
        status,
        replayed,
        version,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

/// HOLDS: over HTTP/1 and HTTP/2, a nested `route_layer` scoped by an outer auth layer and a
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
            assert_eq!(refused.status, StatusCode::UNAUTHORIZED, "{}", refused.body);
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
            (globex.status, globex.replayed, globex.body.as_str()),
            (StatusCode::CREATED, false, "charged globex: 500")
        );
        assert!(acme_again.replayed && acme_again.body == acme.body);
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
        assert_eq!((upper.status, upper.replayed), (StatusCode::CREATED, false));
        assert!(lower.replayed, "the header's name case does not matter");
        assert_eq!(
            (other.replayed, other.body.as_str()),
            (false, "refunded Acme: 9"),
            "another tenant id is another tenant"
        );
        assert_eq!(refunds.load(SeqCst), 2);
    }
}
