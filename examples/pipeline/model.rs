//! The fake model: `POST /v1/summarize {"text": ...}` behaves as its text says (`[429]`,
//! `[503]`, `[400]`, `[hang]`, `[slow:MS]`, otherwise 200 with a summary); `GET /calls` and
//! `GET /calls?text=...` count the calls.

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tower_once::worker::BoxError;

/// Calls per text, and in all. Bounded: a test's texts, not a user's.
#[derive(Clone, Default)]
struct Calls(Arc<Mutex<(u64, HashMap<String, u64>)>>);

impl Calls {
    fn note(&self, text: &str) {
        let mut calls = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        calls.0 += 1;
        if calls.1.len() < 100_000 || calls.1.contains_key(text) {
            *calls.1.entry(text.to_owned()).or_default() += 1;
        }
    }
}

#[derive(Deserialize)]
struct Summarize {
    text: String,
}

#[derive(Deserialize)]
struct CallsQuery {
    text: Option<String>,
}

pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), BoxError> {
    let router = Router::new()
        .route("/v1/summarize", post(summarize))
        .route("/calls", get(calls))
        .with_state(Calls::default());
    let addr = listener.local_addr()?;
    tracing::info!(%addr, "model listening");
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown)
        .await?;
    Ok(())
}

async fn summarize(State(calls): State<Calls>, Json(req): Json<Summarize>) -> Response {
    calls.note(&req.text);
    let text = req.text.as_str();
    if text.contains("[429]") {
        return (
            StatusCode::TOO_MANY_REQUESTS,
            [("retry-after", "1")],
            "slow down",
        )
            .into_response();
    }
    if text.contains("[503]") {
        return (StatusCode::SERVICE_UNAVAILABLE, "overloaded").into_response();
    }
    if text.contains("[400]") {
        return (StatusCode::BAD_REQUEST, "cannot summarize this").into_response();
    }
    if text.contains("[hang]") {
        std::future::pending::<()>().await;
    }
    if let Some(ms) = slow_ms(text) {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    let words: Vec<&str> = text.split_whitespace().take(8).collect();
    let summary = format!("{} ({} chars)", words.join(" "), text.len());
    Json(json!({ "summary": summary })).into_response()
}

/// `[slow:MS]` anywhere in the text.
fn slow_ms(text: &str) -> Option<u64> {
    let start = text.find("[slow:")? + "[slow:".len();
    let end = start + text[start..].find(']')?;
    text[start..end].parse().ok().map(|ms: u64| ms.min(600_000))
}

async fn calls(State(calls): State<Calls>, Query(q): Query<CallsQuery>) -> Json<serde_json::Value> {
    let calls = calls.0.lock().unwrap_or_else(PoisonError::into_inner);
    let n = match q.text {
        Some(text) => calls.1.get(&text).copied().unwrap_or(0),
        None => calls.0,
    };
    Json(json!({ "calls": n }))
}
