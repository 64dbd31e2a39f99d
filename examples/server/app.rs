//! The demo charge service: an axum router behind `IdempotencyLayer`.
//!
//! Shared by `examples/server` and the real-server tests (`tests/`), which include this file.

use axum::body::Bytes;
use axum::extract::{Query, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tower_once::idempotency::store::IdempotencyStore;
use tower_once::idempotency::{scope::HeaderScope, IdempotencyLayer};

/// One charge in the ledger.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct Charge {
    pub(crate) charge_id: String,
    pub(crate) order_id: String,
    pub(crate) amount: u64,
    pub(crate) tenant: String,
}

/// Every charge made, in order: the effect that must happen once per key. In memory, or in
/// Redis so that every server process shares one ledger.
#[derive(Clone)]
pub(crate) enum Ledger {
    Memory(Arc<Mutex<Vec<Charge>>>),
    #[cfg(feature = "redis")]
    Redis(tower_once::idempotency::store::redis::ConnectionManager),
}

#[cfg(feature = "redis")]
const LEDGER_KEY: &str = "{tower-once-demo}:ledger";
#[cfg(feature = "redis")]
const SEQUENCE_KEY: &str = "{tower-once-demo}:sequence";

impl Ledger {
    pub(crate) fn memory() -> Self {
        Self::Memory(Arc::default())
    }

    /// Appends a charge, numbering it in the ledger's own sequence.
    async fn record(
        &self,
        order_id: String,
        amount: u64,
        tenant: String,
    ) -> Result<Charge, String> {
        match self {
            Self::Memory(charges) => {
                let mut charges = charges.lock().unwrap_or_else(|e| e.into_inner());
                let charge = Charge {
                    charge_id: format!("ch_{:06}", charges.len() + 1),
                    order_id,
                    amount,
                    tenant,
                };
                charges.push(charge.clone());
                Ok(charge)
            }
            #[cfg(feature = "redis")]
            Self::Redis(connection) => {
                use tower_once::idempotency::store::redis::redis::AsyncCommands;
                let mut connection = connection.clone();
                let n: u64 = connection
                    .incr(SEQUENCE_KEY, 1)
                    .await
                    .map_err(|e| e.to_string())?;
                let charge = Charge {
                    charge_id: format!("ch_{n:06}"),
                    order_id,
                    amount,
                    tenant,
                };
                let json = serde_json::to_string(&charge).map_err(|e| e.to_string())?;
                let _: u64 = connection
                    .rpush(LEDGER_KEY, json)
                    .await
                    .map_err(|e| e.to_string())?;
                Ok(charge)
            }
        }
    }

    /// Every charge, in order.
    pub(crate) async fn charges(&self) -> Result<Vec<Charge>, String> {
        match self {
            Self::Memory(charges) => Ok(charges.lock().unwrap_or_else(|e| e.into_inner()).clone()),
            #[cfg(feature = "redis")]
            Self::Redis(connection) => {
                use tower_once::idempotency::store::redis::redis::AsyncCommands;
                let entries: Vec<String> = connection
                    .clone()
                    .lrange(LEDGER_KEY, 0, -1)
                    .await
                    .map_err(|e| e.to_string())?;
                entries
                    .iter()
                    .map(|e| serde_json::from_str(e).map_err(|e| e.to_string()))
                    .collect()
            }
        }
    }
}

#[derive(Deserialize)]
struct ChargeRequest {
    order_id: String,
    amount: i64,
}

#[derive(Deserialize)]
struct Knobs {
    delay_ms: Option<u64>,
    fail: Option<u16>,
}

const TENANT_HEADER: &str = "x-tenant-id";
const ANONYMOUS: &str = "anonymous";

/// The demo router: `POST /charges` (key required, scoped by `X-Tenant-Id`), `GET /charges`.
#[allow(dead_code)] // the tests build it; the server binary also waits on its `Detached`
pub(crate) fn router<St: IdempotencyStore>(store: St, lease: Duration, ledger: Ledger) -> Router {
    router_and_detached(store, lease, ledger).0
}

/// The demo router and the handle to wait for handlers whose clients left, at shutdown.
pub(crate) fn router_and_detached<St: IdempotencyStore>(
    store: St,
    lease: Duration,
    ledger: Ledger,
) -> (Router, tower_once::idempotency::Detached) {
    let idempotency = IdempotencyLayer::with_store(store)
        .require_key(true)
        .lease(lease)
        // NOTE: a demo opts into one shared scope for requests without a tenant (the ledger
        // calls them "anonymous"); a real API refuses them (`HeaderScope::new` alone).
        .scope(HeaderScope::new(TENANT_HEADER).allow_missing());
    let detached = idempotency.detached();
    let router = Router::new()
        .route("/charges", post(create_charge).get(list_charges))
        .with_state(ledger)
        .layer(idempotency)
        .layer(middleware::from_fn(log_request));
    (router, detached)
}

async fn create_charge(
    State(ledger): State<Ledger>,
    Query(knobs): Query<Knobs>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Some(ms) = knobs.delay_ms {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    if let Some(code) = knobs.fail {
        return match StatusCode::from_u16(code) {
            Ok(status) if status.is_server_error() => (
                status,
                Json(serde_json::json!({"error": "failure requested"})),
            )
                .into_response(),
            _ => bad_request("fail must be a 5xx status code"),
        };
    }
    let request: ChargeRequest = match serde_json::from_slice(&body) {
        Ok(request) => request,
        Err(e) => return bad_request(&format!("invalid JSON body: {e}")),
    };
    let Ok(amount) = u64::try_from(request.amount) else {
        return bad_request("amount must be a positive integer");
    };
    if amount == 0 {
        return bad_request("amount must be a positive integer");
    }
    let tenant = headers
        .get(TENANT_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or(ANONYMOUS)
        .to_owned();
    match ledger.record(request.order_id, amount, tenant).await {
        Ok(charge) => (StatusCode::CREATED, Json(charge)).into_response(),
        // A 5xx releases the idempotency key, so the client's retry charges again.
        Err(e) => unavailable(&e),
    }
}

async fn list_charges(State(ledger): State<Ledger>) -> Response {
    match ledger.charges().await {
        Ok(charges) => Json(charges).into_response(),
        Err(e) => unavailable(&e),
    }
}

fn unavailable(error: &str) -> Response {
    tracing::warn!(target: "server", %error, "ledger unavailable");
    let body = Json(serde_json::json!({"error": "ledger unavailable"}));
    (StatusCode::SERVICE_UNAVAILABLE, body).into_response()
}

fn bad_request(message: &str) -> Response {
    (
        StatusCode::BAD_REQUEST,
        Json(serde_json::json!({"error": message})),
    )
        .into_response()
}

/// One line per request: method, path, status, whether it was replayed, tenant, latency.
async fn log_request(request: Request, next: Next) -> Response {
    let started = tokio::time::Instant::now();
    let method = request.method().clone();
    let uri = request.uri().clone();
    let tenant = request
        .headers()
        .get(TENANT_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or(ANONYMOUS)
        .to_owned();
    let response = next.run(request).await;
    tracing::info!(
        target: "server",
        %method,
        uri = %uri,
        status = response.status().as_u16(),
        replayed = response.headers().contains_key("idempotent-replayed"),
        tenant,
        latency_ms = started.elapsed().as_millis() as u64,
        "request"
    );
    response
}
