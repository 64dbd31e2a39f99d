//! An axum API where each tenant has its own idempotency keys, kept in Redis, with the API's own
//! error format.
//!
//! ```sh
//! cargo run --example axum_tenants --features redis -- --redis redis://127.0.0.1:6379
//! curl -si localhost:3002/orders -H 'authorization: Bearer acme' -H 'idempotency-key: k1' -d 'two widgets'
//! ```
//!
//! - An auth middleware (outermost) turns the bearer token into a `Tenant` extension, or
//!   answers 401 before anything else runs.
//! - `IdempotencyLayer` scopes every key by that extension: tenants can reuse key strings
//!   freely and can never see each other's responses.
//! - The layer's own errors use the API's `{"error":{"code","message"}}` format.
//! - SIGTERM or SIGINT stops it gracefully (`tower_once::shutdown_signal`): requests in flight
//!   finish, then it exits 0.

use axum::extract::{Extension, Request};
use axum::http::{request::Parts, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use bytes::Bytes;
use std::time::Duration;
use tower_once::idempotency::problem::ProblemKind;
use tower_once::idempotency::store::IdempotencyStore;
use tower_once::idempotency::IdempotencyLayer;

/// The caller's tenant, set by [`authenticate`].
#[derive(Debug, Clone)]
pub(crate) struct Tenant(pub(crate) String);

/// The API: `POST /orders`, idempotent per tenant.
#[allow(dead_code)] // the binary uses `app_and_detached`
pub(crate) fn app<St: IdempotencyStore>(store: St) -> Router {
    app_and_detached(store).0
}

/// The API and what to wait for at shutdown: the handlers (and store writes) that requests
/// whose clients left are finishing on tasks of their own.
pub(crate) fn app_and_detached<St: IdempotencyStore>(
    store: St,
) -> (Router, tower_once::idempotency::Detached) {
    let idempotency = IdempotencyLayer::with_store(store)
        .require_key(true)
        .scope(|parts: &Parts| {
            // NOTE: authenticate runs first (it is the outer layer), so the tenant is here. If
            // it ever ran inside this layer instead, there would be no tenant, and `None`
            // refuses the request (401) rather than sharing one key space between tenants.
            parts.extensions.get::<Tenant>().map(|t| t.0.clone())
        })
        .problem_response(api_error);
    let detached = idempotency.detached();
    let router = Router::new()
        .route("/orders", post(create_order))
        .layer(idempotency)
        .layer(middleware::from_fn(authenticate));
    (router, detached)
}

/// A stand-in for real authentication: `Authorization: Bearer <tenant>`.
async fn authenticate(mut req: Request, next: Next) -> Response {
    let tenant = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .filter(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'))
        .map(str::to_owned);
    match tenant {
        Some(tenant) => {
            req.extensions_mut().insert(Tenant(tenant));
            next.run(req).await
        }
        None => error(
            StatusCode::UNAUTHORIZED,
            "unauthenticated",
            "send Authorization: Bearer <tenant>",
        ),
    }
}

async fn create_order(
    Extension(tenant): Extension<Tenant>,
    body: String,
) -> (StatusCode, Json<serde_json::Value>) {
    let id = format!("ord_{:08x}", fastrand::u32(..));
    let order = serde_json::json!({ "id": id, "tenant": tenant.0, "items": body });
    (StatusCode::CREATED, Json(order))
}

/// The API's error format, for the idempotency layer's own errors too.
fn api_error(kind: ProblemKind, retry_after: Option<Duration>) -> http::Response<Bytes> {
    let code = kind.type_uri().rsplit(':').next().unwrap_or("error");
    let body = serde_json::json!({ "error": { "code": code, "message": kind.title() } });
    let mut response = http::Response::new(Bytes::from(body.to_string()));
    *response.status_mut() = kind.status();
    let headers = response.headers_mut();
    headers.insert(
        "content-type",
        http::HeaderValue::from_static("application/json"),
    );
    if let Some(after) = retry_after {
        headers.insert("retry-after", after.as_secs().max(1).into());
    }
    response
}

fn error(status: StatusCode, code: &str, message: &str) -> Response {
    (
        status,
        Json(serde_json::json!({ "error": { "code": code, "message": message } })),
    )
        .into_response()
}

#[allow(dead_code)] // tests include this file for `app` and do not run `main`
#[tokio::main]
async fn main() -> std::process::ExitCode {
    // SIGTERM or SIGINT; installed before the server says it listens.
    let shutdown = tower_once::shutdown_signal();
    let mut redis = "redis://127.0.0.1:6379".to_owned();
    let mut addr = "127.0.0.1:3002".to_owned();
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        match (flag.as_str(), args.next()) {
            ("--redis", Some(url)) => redis = url,
            ("--addr", Some(a)) => addr = a,
            _ => {
                eprintln!("usage: axum_tenants [--redis URL] [--addr ADDR]");
                return std::process::ExitCode::from(2);
            }
        }
    }
    let store = match tower_once::idempotency::store::redis::RedisStore::connect(&redis).await {
        Ok(store) => store,
        Err(e) => {
            eprintln!("--redis {redis}: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    let listener = match tokio::net::TcpListener::bind(&addr).await {
        Ok(listener) => listener,
        Err(e) => {
            eprintln!("cannot listen on {addr}: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    println!("listening on {addr}, idempotency records in {redis}");
    let (app, detached) = app_and_detached(store);
    let served = axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await;
    // The server stopped: let handlers whose clients left, and their store writes, finish
    // (bounded, like the rest of a shutdown).
    let _ = tokio::time::timeout(Duration::from_secs(30), detached.wait()).await;
    match served {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("server error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
