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

/// Every charge made, in order: the effect that must happen once per key. In memory, in Redis
/// so that every server process shares one ledger, or in Postgres, where each charge commits
/// in one transaction with its idempotency record.
#[derive(Clone)]
pub(crate) enum Ledger {
    Memory(Arc<Mutex<Vec<Charge>>>),
    #[cfg(feature = "redis")]
    Redis(tower_once::idempotency::store::redis::ConnectionManager),
    #[cfg(feature = "postgres")]
    Postgres(tower_once::idempotency::store::postgres::PostgresStore),
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
            // Charges are recorded in the handler's transaction (`create_charge_in_transaction`).
            #[cfg(feature = "postgres")]
            Self::Postgres(_) => Err("the Postgres ledger records in a transaction".to_owned()),
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
            #[cfg(feature = "postgres")]
            Self::Postgres(store) => {
                use tower_once::idempotency::store::postgres::sqlx;
                let rows: Vec<(i64, String, i64, String)> =
                    sqlx::query_as("SELECT id, order_id, amount, tenant FROM charges ORDER BY id")
                        .fetch_all(store.pool())
                        .await
                        .map_err(|e| e.to_string())?;
                Ok(rows
                    .into_iter()
                    .map(|(id, order_id, amount, tenant)| Charge {
                        charge_id: format!("ch_{id:06}"),
                        order_id,
                        amount: u64::try_from(amount).unwrap_or(0),
                        tenant,
                    })
                    .collect())
            }
        }
    }
}

/// The Postgres ledger: the `charges` table beside the store's records, both created (once,
/// under an advisory lock, whichever process starts first) if missing.
#[cfg(feature = "postgres")]
pub(crate) async fn postgres_ledger(url: &str) -> Result<Ledger, String> {
    use tower_once::idempotency::store::postgres::{sqlx, PostgresStore};
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(16)
        .acquire_timeout(Duration::from_secs(1))
        .connect(url)
        .await
        .map_err(|e| format!("--postgres {url}: {e}"))?;
    // One transaction per fresh request: the claim, the charge and the record commit together.
    let store = PostgresStore::new(pool).transactional();
    store.migrate().await.map_err(|e| e.to_string())?;
    sqlx::raw_sql(
        "SELECT pg_advisory_xact_lock(4242002); \
         CREATE TABLE IF NOT EXISTS charges ( \
           id bigserial PRIMARY KEY, order_id text NOT NULL, amount int8 NOT NULL, \
           tenant text NOT NULL, created_at timestamptz NOT NULL DEFAULT now())",
    )
    .execute(store.pool())
    .await
    .map_err(|e| e.to_string())?;
    Ok(Ledger::Postgres(store))
}

#[derive(Deserialize)]
struct ChargeRequest {
    order_id: String,
    amount: i64,
}

#[derive(Deserialize)]
struct Knobs {
    /// Wait before the charge.
    delay_ms: Option<u64>,
    /// Answer this 5xx instead of charging.
    fail: Option<u16>,
}

/// Postgres ledger, for crash tests: how long to wait after the charge is written, before the
/// commit that writes its record with it. A header, so that a retry without it is the same request.
#[cfg(feature = "postgres")]
const COMMIT_DELAY_HEADER: &str = "x-commit-delay-ms";
/// Postgres ledger, for crash tests: how long to wait after the commit, before answering.
#[cfg(feature = "postgres")]
const RESPOND_DELAY_HEADER: &str = "x-respond-delay-ms";

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
    let charge = match ledger {
        #[cfg(feature = "postgres")]
        Ledger::Postgres(_) => post(create_charge_in_transaction),
        _ => post(create_charge),
    };
    let router = Router::new()
        .route("/charges", charge.get(list_charges))
        .with_state(ledger)
        .layer(idempotency)
        .layer(middleware::from_fn(log_request));
    (router, detached)
}

/// A valid charge request: order, amount, tenant.
struct Order {
    order_id: String,
    amount: u64,
    tenant: String,
}

/// Applies the knobs that come before the charge and reads the request, or answers for it.
async fn order(knobs: &Knobs, headers: &HeaderMap, body: &[u8]) -> Result<Order, Response> {
    if let Some(ms) = knobs.delay_ms {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    if let Some(code) = knobs.fail {
        return Err(match StatusCode::from_u16(code) {
            Ok(status) if status.is_server_error() => (
                status,
                Json(serde_json::json!({"error": "failure requested"})),
            )
                .into_response(),
            _ => bad_request("fail must be a 5xx status code"),
        });
    }
    let request: ChargeRequest = match serde_json::from_slice(body) {
        Ok(request) => request,
        Err(e) => return Err(bad_request(&format!("invalid JSON body: {e}"))),
    };
    let amount = match u64::try_from(request.amount) {
        Ok(amount) if amount > 0 && i64::try_from(amount).is_ok() => amount,
        _ => return Err(bad_request("amount must be a positive integer")),
    };
    let tenant = headers
        .get(TENANT_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or(ANONYMOUS)
        .to_owned();
    Ok(Order {
        order_id: request.order_id,
        amount,
        tenant,
    })
}

async fn create_charge(
    State(ledger): State<Ledger>,
    Query(knobs): Query<Knobs>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let order = match order(&knobs, &headers, &body).await {
        Ok(order) => order,
        Err(answer) => return answer,
    };
    match ledger
        .record(order.order_id, order.amount, order.tenant)
        .await
    {
        Ok(charge) => (StatusCode::CREATED, Json(charge)).into_response(),
        // A 5xx releases the idempotency key, so the client's retry charges again.
        Err(e) => unavailable(&e),
    }
}

/// Sleeps for the milliseconds `header` asks for, if any.
#[cfg(feature = "postgres")]
async fn wait_for(headers: &HeaderMap, header: &str) {
    let ms = headers
        .get(header)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    if let Some(ms) = ms {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
}

/// The charge and its idempotency record in one transaction: both commit, or neither.
#[cfg(feature = "postgres")]
async fn create_charge_in_transaction(
    claim: tower_once::idempotency::Claim<tower_once::idempotency::store::postgres::PostgresStore>,
    Query(knobs): Query<Knobs>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    use tower_once::idempotency::store::postgres::sqlx;
    let order = match order(&knobs, &headers, &body).await {
        Ok(order) => order,
        Err(answer) => return answer,
    };
    let charged = async {
        // The transaction the claim opened, holding the key's lock: a duplicate gets 409
        // while it is open, and a crash or a rollback frees the key at once.
        let mut tx = claim.transaction().await?;
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO charges (order_id, amount, tenant) VALUES ($1, $2, $3) RETURNING id",
        )
        .bind(&order.order_id)
        .bind(i64::try_from(order.amount).unwrap_or(i64::MAX))
        .bind(&order.tenant)
        .fetch_one(&mut *tx)
        .await?;
        let charge = Charge {
            charge_id: format!("ch_{id:06}"),
            order_id: order.order_id,
            amount: order.amount,
            tenant: order.tenant,
        };
        wait_for(&headers, COMMIT_DELAY_HEADER).await;
        // The record and the charge, one commit.
        let response = claim
            .commit(tx, (StatusCode::CREATED, Json(charge)))
            .await?;
        wait_for(&headers, RESPOND_DELAY_HEADER).await;
        Ok::<_, tower_once::idempotency::ClaimError>(response)
    };
    charged.await.unwrap_or_else(IntoResponse::into_response)
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
