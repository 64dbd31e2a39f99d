//! Sends in flight: claim rows under a lease into them, record each outcome as it comes, and
//! release what shutdown cuts short. [`OutboxRelay::pass`](super::OutboxRelay::pass) claims
//! once and waits for every send; [`OutboxRelay::run`](super::OutboxRelay::run) keeps claiming
//! into free slots while slow sends go on, so one slow provider holds back only its own rows.

use super::send::{self, Verdict};
use super::{PassReport, Shared};
use crate::error::OutboxError;
use crate::message::{time_from_millis, OutboxMessage};
use crate::metrics::{self, SendOutcome};
use bytes::Bytes;
use sqlx::PgConnection;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::{self, JoinSet};
use tokio::time::Instant;
use tower_once_retry::classify::Classify;
use tower_once_timeout::Deadline;
use tower_service::Service;

type Claimed = (i64, String, String, Vec<u8>, i32, i64);

/// A finished send task: its verdict, or how it failed (a panic).
pub(crate) type Joined = Result<(task::Id, Verdict), task::JoinError>;

/// How many retry times a relay remembers to wake for.
pub(crate) const MAX_RETRY_TIMES: usize = 4096;

/// The sends a relay has in flight, with the row, attempt and lease token of each.
pub(crate) struct Sends {
    tasks: JoinSet<Verdict>,
    running: HashMap<task::Id, (i64, u32, i64)>,
    /// When the rows this relay failed become due again, earliest first (bounded: past
    /// [`MAX_RETRY_TIMES`] the poll finds them).
    pub(crate) retries: BinaryHeap<Reverse<Instant>>,
}

impl Sends {
    pub(crate) fn new() -> Self {
        Self {
            tasks: JoinSet::new(),
            running: HashMap::new(),
            retries: BinaryHeap::new(),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.running.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.running.is_empty()
    }

    /// The next moment a failed row is due again.
    pub(crate) fn next_retry(&self) -> Option<Instant> {
        self.retries.peek().map(|Reverse(at)| *at)
    }

    /// Forgets the retry times that have passed; `true` if there were any.
    pub(crate) fn take_due_retries(&mut self, now: Instant) -> bool {
        let mut any = false;
        while self.retries.peek().is_some_and(|Reverse(at)| *at <= now) {
            self.retries.pop();
            any = true;
        }
        any
    }

    /// Claims up to `limit` due rows under a fresh lease and starts sending them. Returns how
    /// many rows were claimed.
    pub(crate) async fn claim<S, C>(
        &mut self,
        shared: &Arc<Shared<C>>,
        conn: &mut PgConnection,
        sender: &S,
        limit: u32,
        report: &mut PassReport,
    ) -> Result<u64, OutboxError>
    where
        S: Service<OutboxMessage> + Clone + Send + 'static,
        S::Future: Send + 'static,
        S::Response: Send + 'static,
        S::Error: fmt::Display + Send + 'static,
        C: Classify<S::Response, S::Error> + Send + Sync + 'static,
    {
        let config = &shared.config;
        let token = fastrand::i64(..);
        // NOTE: taken before the claim, so every send of this claim ends before the lease does.
        let deadline = Deadline::after(config.effective_send_timeout());
        let lease_ms = i64::try_from(config.lease.as_millis()).unwrap_or(i64::MAX);
        let rows: Vec<Claimed> = sqlx::query_as(&shared.outbox.queries().claim)
            .bind(i64::from(limit))
            .bind(lease_ms)
            .bind(token)
            .fetch_all(&mut *conn)
            .await?;
        let claimed = rows.len() as u64;
        report.claimed += claimed;
        for (id, topic, dedupe_key, payload, attempts, created_ms) in rows {
            let attempts = u32::try_from(attempts).unwrap_or(0);
            if attempts >= config.max_attempts {
                count(report, send::park_unsent(shared, id, token).await, 1);
                continue;
            }
            let message = OutboxMessage {
                id,
                topic,
                dedupe_key,
                payload: Bytes::from(payload),
                attempt: attempts + 1,
                created_at: time_from_millis(created_ms),
                extensions: http::Extensions::new(),
            };
            let task_shared = Arc::clone(shared);
            let sender = sender.clone();
            let handle = self
                .tasks
                .spawn(async move { send::send(&task_shared, sender, message, deadline).await });
            self.running.insert(handle.id(), (id, attempts + 1, token));
        }
        Ok(claimed)
    }

    /// The next send to finish. Cancel-safe (nothing is lost if another branch of a `select!`
    /// wins); pending forever when nothing is in flight.
    pub(crate) async fn next_done(&mut self) -> Joined {
        match self.tasks.join_next_with_id().await {
            Some(joined) => joined,
            None => std::future::pending().await,
        }
    }

    /// Records `first` and every other send finished by now (the sent ones in one statement).
    /// Not cancel-safe: await it to the end, outside any `select!`.
    pub(crate) async fn record<C>(
        &mut self,
        first: Joined,
        shared: &Shared<C>,
        report: &mut PassReport,
    ) {
        let mut sent = Vec::new();
        let mut next = Some(first);
        while let Some(joined) = next.take() {
            let (task, verdict) = verdict_of(joined);
            if let Some((id, attempt, token)) = self.running.remove(&task) {
                match verdict {
                    Verdict::Sent => sent.push(id),
                    failure => {
                        let (outcome, wait) =
                            send::record_failure(shared, id, attempt, token, failure).await;
                        if let Some(wait) = wait {
                            if self.retries.len() < MAX_RETRY_TIMES {
                                let due = Instant::now() + wait.min(Duration::from_secs(3600));
                                self.retries.push(Reverse(due));
                            }
                        }
                        count(report, outcome, 1);
                    }
                }
            }
            next = self.tasks.try_join_next_with_id();
        }
        if !sent.is_empty() {
            let outcome = send::record_sent(shared, &sent).await;
            metrics::record_many(outcome, sent.len() as u64);
            count(report, outcome, sent.len() as u64);
        }
    }

    /// Stops every send still running and gives its row back at once (uncounted). A send that
    /// finished meanwhile is recorded as it ended, not released.
    pub(crate) async fn release_all<C>(&mut self, shared: &Shared<C>, report: &mut PassReport) {
        self.tasks.abort_all();
        let mut finished = Vec::new();
        while let Some(joined) = self.tasks.join_next_with_id().await {
            match joined {
                Ok(done) => finished.push(Ok(done)),
                // Cut by the abort: released below. A panic is a failed attempt.
                Err(err) if err.is_panic() => finished.push(Err(err)),
                Err(_) => {}
            }
        }
        for done in finished {
            self.record_one(done, shared, report).await;
        }
        if self.running.is_empty() {
            return;
        }
        tracing::warn!(
            rows = self.running.len(),
            "shutdown cut sends short; their rows are released"
        );
        let mut by_token: HashMap<i64, Vec<i64>> = HashMap::new();
        for (_, (id, _, token)) in self.running.drain() {
            by_token.entry(token).or_default().push(id);
        }
        for (token, ids) in by_token {
            send::release(shared, &ids, token).await;
            report.released += ids.len() as u64;
        }
    }

    /// Records one finished send on its own.
    async fn record_one<C>(&mut self, done: Joined, shared: &Shared<C>, report: &mut PassReport) {
        let (task, verdict) = verdict_of(done);
        if let Some((id, attempt, token)) = self.running.remove(&task) {
            let (outcome, _) = send::record_failure(shared, id, attempt, token, verdict).await;
            count(report, outcome, 1);
        }
    }
}

/// A finished task's verdict. A panicking sender is a failed attempt, not a dead relay.
fn verdict_of(joined: Joined) -> (task::Id, Verdict) {
    match joined {
        Ok(done) => done,
        Err(err) => (
            err.id(),
            Verdict::Retry {
                after: None,
                error: "the sender panicked".to_owned(),
            },
        ),
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
