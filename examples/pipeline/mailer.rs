//! The fake email provider: `POST /v1/emails` behind `IdempotencyLayer` keyed by the outbox's
//! dedupe key, so a message the relay sends twice is one email. `GET /emails` lists them (one
//! per key); `GET /deliveries` counts every POST that reached it, replays included.

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::collections::HashSet;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use tower_once::idempotency::{IdempotencyLayer, IDEMPOTENCY_KEY};
use tower_once::worker::BoxError;

#[derive(Clone, Default)]
struct Mailbox {
    emails: Arc<Mutex<(Vec<Email>, HashSet<String>)>>,
    deliveries: Arc<AtomicU64>,
}

#[derive(Clone, Serialize)]
struct Email {
    job_id: String,
    to: String,
    key: String,
}

#[derive(Deserialize)]
struct Outgoing {
    job_id: String,
    to: String,
}

pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), BoxError> {
    let mailbox = Mailbox::default();
    let idempotency = IdempotencyLayer::new().require_key(true);
    let detached = idempotency.detached();
    let router = Router::new()
        .route(
            "/v1/emails",
            post(send)
                .layer(idempotency)
                .layer(middleware::from_fn_with_state(mailbox.clone(), count)),
        )
        .route("/emails", get(emails))
        .route("/deliveries", get(deliveries))
        .with_state(mailbox);
    let addr = listener.local_addr()?;
    tracing::info!(%addr, "mailer listening");
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown)
        .await?;
    // Sends whose relay left mid-request finish, and their records land, before the exit.
    let _ = tokio::time::timeout(std::time::Duration::from_secs(30), detached.wait()).await;
    Ok(())
}

/// Outside the idempotency layer: every POST, replays included.
async fn count(State(mailbox): State<Mailbox>, request: Request, next: Next) -> Response {
    mailbox.deliveries.fetch_add(1, Ordering::SeqCst);
    next.run(request).await
}

async fn send(
    State(mailbox): State<Mailbox>,
    headers: axum::http::HeaderMap,
    Json(mail): Json<Outgoing>,
) -> Response {
    let key = headers
        .get(IDEMPOTENCY_KEY)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let mut guard = mailbox
        .emails
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    let (emails, keys) = &mut *guard;
    // The layer already keeps a key to one run; this list is bounded for a long demo.
    if emails.len() >= 100_000 {
        return (StatusCode::INSUFFICIENT_STORAGE, "mailbox full").into_response();
    }
    if keys.insert(key.clone()) {
        emails.push(Email {
            job_id: mail.job_id,
            to: mail.to,
            key,
        });
    }
    (StatusCode::ACCEPTED, Json(json!({ "status": "accepted" }))).into_response()
}

async fn emails(State(mailbox): State<Mailbox>) -> Json<Vec<Email>> {
    Json(
        mailbox
            .emails
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .0
            .clone(),
    )
}

async fn deliveries(State(mailbox): State<Mailbox>) -> Json<serde_json::Value> {
    Json(json!({ "deliveries": mailbox.deliveries.load(Ordering::SeqCst) }))
}
