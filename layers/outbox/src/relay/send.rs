//! One send: through the service inside a deadline, classified, recorded on its row.

use super::Shared;
use crate::message::OutboxMessage;
use crate::metrics::{self, SendOutcome};
use std::fmt;
use std::time::Duration;
use tower_once_retry::classify::{Action, Classify};
use tower_once_timeout::Deadline;
use tower_service::Service;
use tracing::Instrument;

/// The longest wait a provider's `Retry-After` can set.
const MAX_PROVIDER_DELAY: Duration = Duration::from_secs(24 * 3600);

/// What the attempt says about the row.
pub(crate) enum Verdict {
    /// Not sent: the lease was too far gone when the task started (the row is released).
    Unsent,
    Sent,
    Retry {
        after: Option<Duration>,
        error: String,
    },
    Park {
        error: String,
    },
}

/// Sends one claimed row and classifies the outcome. The pass records it, so that rows
/// sent at the same moment are marked in one statement.
pub(crate) async fn send<S, C>(
    shared: &Shared<C>,
    mut sender: S,
    message: OutboxMessage,
    deadline: Deadline,
) -> Verdict
where
    S: Service<OutboxMessage>,
    S::Error: fmt::Display,
    C: Classify<S::Response, S::Error>,
{
    let span = tracing::info_span!(
        "outbox_send",
        id = message.id,
        topic = %message.topic,
        dedupe_key = %message.dedupe_key,
        attempt = message.attempt,
    );
    async move {
        // NOTE: the deadline was set before the claim, so it ends before the lease does, however
        // long the pass took to get here; a send that could not start in time does not start.
        if deadline.is_expired() {
            tracing::warn!("the lease ran short before the send could start; released");
            return Verdict::Unsent;
        }
        // The deadline travels with the message too, for a sender that hands it to a task.
        let mut message = message;
        deadline.attach(&mut message);
        let call = deadline.in_scope(async {
            std::future::poll_fn(|cx| sender.poll_ready(cx)).await?;
            sender.call(message).await
        });
        match tokio::time::timeout_at(deadline.instant(), call).await {
            Ok(result) => match shared.classifier.classify(&result) {
                Action::Success => Verdict::Sent,
                // A provider still running the same key's request: ask again later.
                Action::Retry { after } | Action::InProgress { after } => Verdict::Retry {
                    after,
                    error: error_text(&result),
                },
                _ => Verdict::Park {
                    error: error_text(&result),
                },
            },
            Err(_) => Verdict::Retry {
                after: None,
                error: "send timed out before the lease could run out".to_owned(),
            },
        }
    }
    .instrument(span)
    .await
}

fn error_text<R, E: fmt::Display>(result: &Result<R, E>) -> String {
    match result {
        Ok(_) => "the provider's response was classified as a failure".to_owned(),
        Err(e) => {
            // Postgres text cannot hold NUL: a provider's bytes must not make the record fail.
            let mut text = e.to_string().replace('\0', "\u{FFFD}");
            // A hostile or verbose provider must not fill the table.
            if text.len() > 2048 {
                let mut end = 2048;
                while !text.is_char_boundary(end) {
                    end -= 1;
                }
                text.truncate(end);
            }
            text
        }
    }
}

/// Marks rows sent, in one statement, retried a few times: every failure here means those
/// rows are sent again after their lease (with the same dedupe key). Not fenced by the lease:
/// they were sent, whoever holds them now.
pub(crate) async fn record_sent<C>(shared: &Shared<C>, ids: &[i64]) -> SendOutcome {
    let mut wait = Duration::from_millis(100);
    for _ in 0..3 {
        let marked = sqlx::query(&shared.outbox.queries().sent)
            .bind(ids)
            .execute(shared.outbox.pool())
            .await;
        match marked {
            Ok(_) => return SendOutcome::Sent,
            Err(e) => {
                tracing::warn!(error = %e, rows = ids.len(), "could not record sent messages; retrying");
                tokio::time::sleep(wait).await;
                wait *= 4;
            }
        }
    }
    tracing::error!(
        rows = ids.len(),
        "sent but not recorded: sent again after their lease, with the same dedupe keys"
    );
    SendOutcome::SentUnrecorded
}

/// Records a failed attempt on its row: backoff (or the provider's delay), or parked. Fenced
/// by the lease token. Returns the outcome and, for a row that will be retried, its wait.
pub(crate) async fn record_failure<C>(
    shared: &Shared<C>,
    id: i64,
    attempt: u32,
    token: i64,
    verdict: Verdict,
) -> (SendOutcome, Option<Duration>) {
    let (outcome, wait) = match verdict {
        Verdict::Sent => {
            let outcome = record_sent(shared, &[id]).await;
            metrics::record(outcome);
            return (outcome, None);
        }
        Verdict::Unsent => (release(shared, &[id], token).await, Some(Duration::ZERO)),
        Verdict::Retry { after, error } => {
            let delay = after.map_or_else(
                || {
                    shared
                        .config
                        .backoff
                        .delay(attempt, Duration::ZERO, &mut fastrand::Rng::new())
                },
                |after| after.min(MAX_PROVIDER_DELAY),
            );
            tracing::info!(id, attempt, error = %error, ?delay, "send failed; retried after a wait");
            let outcome = failed(shared, id, token, Some(&error), delay, false, 1).await;
            (outcome, Some(delay))
        }
        Verdict::Park { error } => {
            tracing::warn!(id, attempt, error = %error, "send failed for good; parked");
            (
                failed(shared, id, token, Some(&error), Duration::ZERO, true, 1).await,
                None,
            )
        }
    };
    metrics::record(outcome);
    (
        outcome,
        wait.filter(|_| outcome == SendOutcome::Failed || outcome == SendOutcome::Released),
    )
}

/// Gives rows back at once, uncounted (fenced: only while still ours).
pub(crate) async fn release<C>(shared: &Shared<C>, ids: &[i64], token: i64) -> SendOutcome {
    let released = sqlx::query(&shared.outbox.queries().release)
        .bind(ids)
        .bind(token)
        .execute(shared.outbox.pool())
        .await;
    if let Err(e) = released {
        // The lease runs out instead.
        tracing::warn!(error = %e, "could not release rows");
    }
    SendOutcome::Released
}

/// Parks a claimed row without sending it: earlier relays died on it `max_attempts` times.
pub(crate) async fn park_unsent<C>(shared: &Shared<C>, id: i64, token: i64) -> SendOutcome {
    tracing::warn!(id, "relays stopped on this row too often; parked unsent");
    let outcome = failed(shared, id, token, None, Duration::ZERO, true, 0).await;
    metrics::record(outcome);
    outcome
}

async fn failed<C>(
    shared: &Shared<C>,
    id: i64,
    token: i64,
    error: Option<&str>,
    delay: Duration,
    park: bool,
    count: i32,
) -> SendOutcome {
    // Postgres intervals have limits; no backoff needs more than a month.
    let delay = delay.min(Duration::from_secs(30 * 24 * 3600));
    let delay_ms = i64::try_from(delay.as_millis()).unwrap_or(i64::MAX);
    let max = i32::try_from(shared.config.max_attempts).unwrap_or(i32::MAX);
    let result: Result<Option<bool>, _> = sqlx::query_scalar(&shared.outbox.queries().failed)
        .bind(id)
        .bind(error)
        .bind(delay_ms)
        .bind(park)
        .bind(max)
        .bind(token)
        .bind(count)
        .fetch_optional(shared.outbox.pool())
        .await;
    match result {
        Ok(Some(true)) => SendOutcome::Parked,
        Ok(Some(false)) => SendOutcome::Failed,
        Ok(None) => SendOutcome::LeaseLost,
        Err(e) => {
            // The lease runs out and the row comes back: the attempt is not counted.
            tracing::warn!(error = %e, "could not record a failed send");
            SendOutcome::Failed
        }
    }
}
