//! The relay's loop: a pass whenever rows may be due (a `NOTIFY` on insert, or the poll
//! interval), backoff while Postgres is away, sent rows purged now and then; when each happens
//! is the [`Schedule`]'s to say.

use super::pass::Sends;
use super::schedule::Schedule;
use super::{OutboxRelay, RelayReport};
use crate::message::OutboxMessage;
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgListener, PgPoolOptions};
use sqlx::Postgres;
use std::fmt;
use std::future::Future;
use std::time::Duration;
use tokio::time::Instant;
use tower_once_core::slots::Slots;
use tower_once_core::time::saturating_add;
use tower_once_retry::classify::Classify;
use tower_service::Service;

/// How many sent rows past `retain_sent` are purged at a time.
const PURGE_BATCH: i64 = 1000;

impl<S, C> OutboxRelay<S, C>
where
    S: Service<OutboxMessage> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
    S::Error: fmt::Display + Send + 'static,
    C: Classify<S::Response, S::Error> + Send + Sync + 'static,
{
    /// Relays until `shutdown` resolves, then lets sends in flight finish within
    /// `shutdown_grace` and releases the rest. Never fails: while Postgres is unreachable it
    /// backs off (100 ms doubling to 5 s) and logs.
    ///
    /// Up to `batch_size` sends are in flight; while more rows are due, free slots are refilled
    /// once a quarter of them is free (or none is busy). Otherwise it claims when the table's
    /// `NOTIFY` comes (sent by the insert trigger when a transaction that enqueued commits),
    /// when a row it failed is due again, and at least every `poll_interval` (rows other relays
    /// failed, a notification missed while reconnecting).
    pub async fn run<F: Future>(self, shutdown: F) -> RelayReport {
        let mut shutdown = std::pin::pin!(shutdown);
        let mut relay = RelayLoop::new(&self);
        tracing::info!(
            table = self.shared.outbox.table_name(),
            "outbox relay started"
        );
        loop {
            if relay.listener.is_none() {
                // Dropping a half-made listener is harmless: shutdown does not wait for it.
                tokio::select! {
                    biased;
                    _ = &mut shutdown => break,
                    made = self.listen() => relay.listener = made,
                }
            }
            if let Some(limit) = relay.schedule.claim_now(relay.sends.len(), Instant::now()) {
                // Only the wait for a connection races shutdown: a claim statement, once sent,
                // is seen through (dropping it could lease rows nobody sends).
                let acquired = tokio::select! {
                    biased;
                    _ = &mut shutdown => break,
                    conn = self.shared.outbox.pool().acquire() => conn,
                };
                if relay.claim(acquired, limit).await {
                    continue;
                }
            }
            if relay.schedule.purge_now(Instant::now()) {
                self.purge().await;
            }
            let wake = relay
                .schedule
                .wake_at(relay.sends.len(), relay.sends.next_retry());
            tokio::select! {
                biased;
                _ = &mut shutdown => break,
                done = relay.sends.next_done() => {
                    relay.sends.record(done, &self.shared, &mut relay.report.totals).await;
                }
                woke = recv(&mut relay.listener) => relay.notified(woke),
                () = tokio::time::sleep_until(wake) => relay.woke(),
            }
        }
        relay.shut_down().await
    }

    /// Listens on the table's channel; `None` (polling only) if that fails for now.
    async fn listen(&self) -> Option<PgListener> {
        let outbox = &self.shared.outbox;
        let listen = async {
            let oid: i64 = sqlx::query_scalar("SELECT $1::regclass::oid::int8")
                .bind(outbox.table_name())
                .fetch_one(outbox.pool())
                .await?;
            // A connection of its own, outside the application's pool: LISTEN holds it for
            // good, and a small pool must still have room for the passes.
            let options = (*outbox.pool().connect_options()).clone();
            let own = PgPoolOptions::new()
                .max_connections(1)
                .connect_lazy_with(options);
            let mut listener = PgListener::connect_with(&own).await?;
            listener.listen(&format!("tower_once_outbox_{oid}")).await?;
            Ok::<_, sqlx::Error>(listener)
        };
        match listen.await {
            Ok(listener) => Some(listener),
            Err(e) => {
                tracing::debug!(error = %e, "cannot LISTEN; polling only for now");
                None
            }
        }
    }

    async fn purge(&self) {
        let Some(retain) = self.shared.config.retain_sent else {
            return;
        };
        let retain = retain.min(Duration::from_secs(100 * 365 * 24 * 3600));
        let retain_ms = i64::try_from(retain.as_millis()).unwrap_or(i64::MAX);
        let purged = sqlx::query(&self.shared.outbox.queries().purge_sent)
            .bind(retain_ms)
            .bind(PURGE_BATCH)
            .execute(self.shared.outbox.pool())
            .await;
        if let Err(e) = purged {
            tracing::debug!(error = %e, "could not purge sent rows");
        }
    }
}

/// The relay's loop between its steps (tower's `buffer/worker.rs` shape): what it runs, what
/// it has done, and its [`Schedule`].
struct RelayLoop<'r, S, C> {
    relay: &'r OutboxRelay<S, C>,
    schedule: Schedule,
    listener: Option<PgListener>,
    sends: Sends,
    report: RelayReport,
}

impl<'r, S, C> RelayLoop<'r, S, C>
where
    S: Service<OutboxMessage> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
    S::Error: fmt::Display + Send + 'static,
    C: Classify<S::Response, S::Error> + Send + Sync + 'static,
{
    fn new(relay: &'r OutboxRelay<S, C>) -> Self {
        let config = &relay.shared.config;
        Self {
            relay,
            schedule: Schedule::new(
                Slots::new(config.batch_size as usize),
                config.poll_interval,
                Instant::now(),
            ),
            listener: None,
            sends: Sends::new(),
            report: RelayReport::default(),
        }
    }

    /// Claims up to `limit` due rows into free send slots. Returns whether to claim again at
    /// once (the claim came back full).
    async fn claim(
        &mut self,
        acquired: Result<PoolConnection<Postgres>, sqlx::Error>,
        limit: u32,
    ) -> bool {
        let shared = &self.relay.shared;
        self.report.passes += 1;
        self.schedule.claiming(Instant::now());
        let claimed = match acquired {
            Ok(mut conn) => {
                self.sends
                    .claim(
                        shared,
                        &mut conn,
                        &self.relay.sender,
                        limit,
                        &mut self.report.totals,
                    )
                    .await
            }
            Err(e) => Err(e.into()),
        };
        match claimed {
            Ok(claimed) => self.schedule.claimed(claimed, limit, self.sends.len()),
            Err(e) => {
                self.report.failed_passes += 1;
                // From the end of the failed claim, which may have waited long itself.
                let (failures, warn) = self.schedule.claim_failed(Instant::now());
                if warn {
                    tracing::warn!(error = %e, failures, "outbox claim failed; backing off");
                } else {
                    tracing::debug!(error = %e, failures, "outbox claim failed; backing off");
                }
                false
            }
        }
    }

    /// A notification came (`true`), or the listener broke (`false`: listen again).
    fn notified(&mut self, woke: bool) {
        if !woke {
            self.listener = None;
        }
        self.schedule.notified();
    }

    /// The wake-up time came.
    fn woke(&mut self) {
        let now = Instant::now();
        let rows_due = self.sends.take_due_retries(now);
        self.schedule.woke(now, rows_due);
    }

    /// No new claims; sends in flight get the grace period, then are released.
    async fn shut_down(mut self) -> RelayReport {
        let shared = &self.relay.shared;
        let grace = saturating_add(Instant::now(), shared.config.shutdown_grace);
        while !self.sends.is_empty() {
            tokio::select! {
                done = self.sends.next_done() => self.sends.record(done, shared, &mut self.report.totals).await,
                () = tokio::time::sleep_until(grace) => break,
            }
        }
        self.sends
            .release_all(shared, &mut self.report.totals)
            .await;
        tracing::info!(report = ?self.report, "outbox relay stopped");
        self.report
    }
}

/// Waits for a notification: `true` when one came, `false` when the listener broke (and
/// never when there is none).
async fn recv(listener: &mut Option<PgListener>) -> bool {
    match listener {
        Some(l) => {
            let woke = l.recv().await.is_ok();
            // One pass serves every notification that came in meanwhile (a burst of commits).
            while l.next_buffered().is_some() {}
            woke
        }
        None => std::future::pending().await,
    }
}
