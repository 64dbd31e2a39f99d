//! `POST /v1/summaries`: idempotent per tenant and key, enqueues one job whose id derives from
//! that scoped key. `GET /v1/summaries/{job_id}`: the summary once the worker wrote it.

use crate::args::Args;
use crate::db;
use axum::extract::{Path, State};
use axum::http::{Request, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use serde::Deserialize;
use serde_json::json;
use std::future::Future;
use tower_once::idempotency::scope::HeaderScope;
use tower_once::idempotency::store::redis::RedisStore;
use tower_once::idempotency::store::StoreKey;
use tower_once::idempotency::IdempotencyLayer;
use tower_once::outbox::sqlx::PgPool;
use tower_once::worker::redis::aio::ConnectionManager;
use tower_once::worker::{BoxError, JobId, Producer};

pub(crate) const STREAM: &str = "jobs:summaries";

#[derive(Clone)]
struct App {
    producer: Producer<ConnectionManager>,
    pool: PgPool,
}

#[derive(Deserialize)]
struct NewSummary {
    text: String,
    notify: String,
}

pub(crate) async fn serve(
    args: &Args,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), BoxError> {
    let (pool, _) = db::connect(&args.postgres, false).await?;
    let client = tower_once::worker::redis::Client::open(args.redis.as_str())?;
    let conn = ConnectionManager::new(client).await?;
    let app = App {
        producer: Producer::new(conn, STREAM),
        pool,
    };
    let store = RedisStore::connect(&args.redis).await?;
    let idempotency = IdempotencyLayer::with_store(store)
        .require_key(true)
        .scope(HeaderScope::new("x-tenant-id"));
    let detached = idempotency.detached();
    let router = Router::new()
        .route("/v1/summaries", post(create).layer(idempotency))
        .route("/v1/summaries/{job_id}", get(read))
        .with_state(app);
    let addr = listener.local_addr()?;
    tracing::info!(%addr, "api listening");
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown)
        .await?;
    // Handlers whose clients left still finish (and enqueue) before the process ends.
    detached.wait().await;
    Ok(())
}

fn problem(status: StatusCode, detail: &str) -> Response {
    (
        status,
        Json(json!({ "status": status.as_u16(), "detail": detail })),
    )
        .into_response()
}

async fn create(
    State(app): State<App>,
    Extension(key): Extension<StoreKey>,
    request: Request<axum::body::Body>,
) -> Response {
    let tenant = request
        .headers()
        .get("x-tenant-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let body = match axum::body::to_bytes(request.into_body(), 64 * 1024).await {
        Ok(body) => body,
        Err(_) => return problem(StatusCode::PAYLOAD_TOO_LARGE, "body over 64 KiB"),
    };
    let Ok(new) = serde_json::from_slice::<NewSummary>(&body) else {
        return problem(
            StatusCode::BAD_REQUEST,
            r#"expected {"text": "...", "notify": "a@example.com"}"#,
        );
    };
    if new.text.is_empty() || !new.notify.contains('@') {
        return problem(
            StatusCode::BAD_REQUEST,
            "text must not be empty, notify must be an address",
        );
    }
    // Postgres text cannot hold NUL: refuse it here rather than accept a job that cannot finish.
    if new.text.contains('\0') || new.notify.contains('\0') || new.notify.len() > 320 {
        return problem(
            StatusCode::BAD_REQUEST,
            "text and notify must not contain NUL; notify at most 320 bytes",
        );
    }
    // The same tenant and Idempotency-Key always give the same job id: a retry that reaches
    // this handler again (the first try died after XADD) enqueues the same job.
    let job_id = JobId::from_scoped_key(&key);
    let payload = json!({ "tenant": tenant, "text": new.text, "notify": new.notify });
    match app.producer.enqueue(&job_id, payload.to_string()).await {
        Ok(_) => (
            StatusCode::ACCEPTED,
            Json(json!({ "job_id": job_id.as_str(), "status": "queued" })),
        )
            .into_response(),
        // A 503 releases the key: the client's retry runs again.
        Err(e) => {
            tracing::warn!(error = %e, "enqueue failed");
            problem(StatusCode::SERVICE_UNAVAILABLE, "the queue is unavailable")
        }
    }
}

/// A tenant that names itself reads only its own summaries; without `X-Tenant-Id` the job id,
/// which only the tenant that submitted it was given, is the capability.
async fn read(
    State(app): State<App>,
    Path(job_id): Path<String>,
    headers: axum::http::HeaderMap,
) -> Response {
    if JobId::new(job_id.as_str()).is_err() {
        return problem(StatusCode::NOT_FOUND, "no such job");
    }
    let tenant = headers.get("x-tenant-id").and_then(|v| v.to_str().ok());
    let row: Result<Option<(String, String)>, _> = tower_once::outbox::sqlx::query_as(
        "SELECT summary, tenant FROM summaries WHERE job_id = $1",
    )
    .bind(&job_id)
    .fetch_optional(&app.pool)
    .await;
    let summary = row.map(|row| {
        row.filter(|(_, owner)| tenant.is_none_or(|t| t == owner))
            .map(|(summary, _)| summary)
    });
    match summary {
        Ok(Some(summary)) => (
            StatusCode::OK,
            Json(json!({ "job_id": job_id, "summary": summary })),
        )
            .into_response(),
        Ok(None) => problem(StatusCode::NOT_FOUND, "no summary yet"),
        Err(e) => {
            tracing::warn!(error = %e, "read failed");
            problem(
                StatusCode::SERVICE_UNAVAILABLE,
                "the database is unavailable",
            )
        }
    }
}
