//! One pass: claim a batch under a lease, send it concurrently, release what shutdown cut.

use super::send::{self, Verdict};
use super::{PassReport, Shared};
use crate::error::OutboxError;
use crate::message::{time_from_millis, OutboxMessage};
use crate::metrics::{self, SendOutcome};
use bytes::Bytes;
use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use tokio::task::JoinSet;
use tower_once_core::time::saturating_add;
use tower_once_retry::classify::Classify;
use tower_once_timeout::Deadline;
use tower_service::Service;

type Claimed = (i64, String, String, Vec<u8>, i32, i64);

/// Claims and sends one batch. Once `shutdown` resolves (or if `stopping` is already set by
/// the caller's loop), sends in flight get `shutdown_grace`; the ones still running after it
/// are dropped and their rows released for another pass.
pub(crate) async fn run<S, C, F>(
    shared: &Arc<Shared<C>>,
    sender: &S,
    mut shutdown: Pin<&mut F>,
    stopping: &mut bool,
) -> Result<PassReport, OutboxError>
where
    S: Service<OutboxMessage> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
    S::Error: fmt::Display + Send + 'static,
    C: Classify<S::Response, S::Error> + Send + Sync + 'static,
    F: Future,
{
    let config = &shared.config;
    let token = fastrand::i64(..);
    // Taken before the claim, so that every send of this pass ends before the lease does.
    let deadline = Deadline::after(config.effective_send_timeout());
    let lease_ms = i64::try_from(config.lease.as_millis()).unwrap_or(i64::MAX);
    let rows: Vec<Claimed> = sqlx::query_as(&shared.outbox.queries().claim)
        .bind(i64::from(config.batch_size))
        .bind(lease_ms)
        .bind(token)
        .fetch_all(shared.outbox.pool())
        .await?;
    let mut report = PassReport {
        claimed: rows.len() as u64,
        ..PassReport::default()
    };
    let mut tasks = JoinSet::new();
    let mut running = HashMap::with_capacity(rows.len());
    for (id, topic, dedupe_key, payload, attempts, created_ms) in rows {
        let attempts = u32::try_from(attempts).unwrap_or(0);
        if attempts >= config.max_attempts {
            count(&mut report, send::park_unsent(shared, id, token).await, 1);
            continue;
        }
        let message = OutboxMessage {
            id,
            topic,
            dedupe_key,
            payload: Bytes::from(payload),
            attempt: attempts + 1,
            created_at: time_from_millis(created_ms),
        };
        let task_shared = Arc::clone(shared);
        let sender = sender.clone();
        let handle =
            tasks.spawn(async move { send::send(&task_shared, sender, message, deadline).await });
        running.insert(handle.id(), (id, attempts + 1));
    }

    let mut grace = None;
    while !tasks.is_empty() {
        if *stopping && grace.is_none() {
            grace = Some(saturating_add(
                tokio::time::Instant::now(),
                config.shutdown_grace,
            ));
        }
        tokio::select! {
            joined = tasks.join_next_with_id() => {
                let Some(first) = joined else { break };
                // Everything finished by now is recorded together: one UPDATE for the sent.
                let mut sent = Vec::new();
                let mut next = Some(first);
                while let Some(joined) = next.take() {
                    let (task, verdict) = match joined {
                        Ok((task, verdict)) => (task, verdict),
                        // A panicking sender is a failed attempt, not a dead relay.
                        Err(err) => (err.id(), Verdict::Retry {
                            after: None,
                            error: "the sender panicked".to_owned(),
                        }),
                    };
                    if let Some((id, attempt)) = running.remove(&task) {
                        match verdict {
                            Verdict::Sent => sent.push(id),
                            failure => {
                                let outcome =
                                    send::record_failure(shared, id, attempt, token, failure).await;
                                count(&mut report, outcome, 1);
                            }
                        }
                    }
                    next = tasks.try_join_next_with_id();
                }
                if !sent.is_empty() {
                    let outcome = send::record_sent(shared, &sent).await;
                    metrics::record_many(outcome, sent.len() as u64);
                    count(&mut report, outcome, sent.len() as u64);
                }
            }
            _ = &mut shutdown, if !*stopping => *stopping = true,
            () = sleep_until(grace), if grace.is_some() => {
                tasks.abort_all();
                while tasks.join_next().await.is_some() {}
                break;
            }
        }
    }
    if !running.is_empty() {
        let ids: Vec<i64> = running.values().map(|&(id, _)| id).collect();
        tracing::warn!(
            rows = ids.len(),
            "shutdown cut sends short; their rows are released"
        );
        sqlx::query(&shared.outbox.queries().release)
            .bind(&ids)
            .bind(token)
            .execute(shared.outbox.pool())
            .await?;
        report.released += ids.len() as u64;
    }
    Ok(report)
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn count(report: &mut PassReport, outcome: SendOutcome, rows: u64) {
    match outcome {
        SendOutcome::Sent | SendOutcome::SentUnrecorded => report.sent += rows,
        SendOutcome::Failed => report.failed += rows,
        SendOutcome::Parked => report.parked += rows,
        SendOutcome::LeaseLost | SendOutcome::Released => report.released += rows,
    }
}
