//! The relay's loop: a pass whenever rows may be due (a `NOTIFY` on insert, or the poll
//! interval), backoff while Postgres is away, sent rows purged now and then.

use super::pass::Sends;
use super::{OutboxRelay, RelayReport};
use crate::message::OutboxMessage;
use sqlx::postgres::{PgListener, PgPoolOptions};
use std::fmt;
use std::future::Future;
use std::time::Duration;
use tokio::time::Instant;
use tower_once_core::outage::Outage;
use tower_once_core::slots::Slots;
use tower_once_core::time::saturating_add;
use tower_once_retry::classify::Classify;
use tower_service::Service;

/// How often sent rows past `retain_sent` are purged, and how many at a time.
const PURGE_EVERY: Duration = Duration::from_secs(60);
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
    /// once a quarter of them is free (or none is busy). Otherwise it claims when the table's `NOTIFY` comes (sent by the
    /// insert trigger when a transaction that enqueued commits), when a row it failed is due
    /// again, and at least every `poll_interval` (rows other relays failed, a notification
    /// missed while reconnecting).
    pub async fn run<F: Future>(self, shutdown: F) -> RelayReport {
        let mut shutdown = std::pin::pin!(shutdown);
        let shared = &self.shared;
        let config = &shared.config;
        let slots = Slots::new(config.batch_size as usize);
        let mut report = RelayReport::default();
        let mut listener: Option<PgListener> = None;
        let mut sends = Sends::new();
        let mut outage = Outage::default();
        // A claim into any free slot is wanted (start, NOTIFY, poll, a failed row due again).
        let mut wanted = true;
        // The last claim came back full: refill once a quarter of the slots is free.
        let mut backlog = false;
        let mut retry_at: Option<Instant> = None;
        let mut next_poll = Instant::now();
        let mut next_purge = Instant::now();
        tracing::info!(table = shared.outbox.table_name(), "outbox relay started");
        'relay: loop {
            if listener.is_none() {
                // Dropping a half-made listener is harmless: shutdown does not wait for it.
                tokio::select! {
                    biased;
                    _ = &mut shutdown => break 'relay,
                    made = self.listen() => listener = made,
                }
            }
            let now = Instant::now();
            let free = slots.free(sends.len());
            let refill = backlog && slots.refill(sends.len());
            if free > 0 && (wanted || refill) && retry_at.is_none_or(|at| at <= now) {
                // Only the wait for a connection races shutdown: a claim statement, once sent,
                // is seen through (dropping it could lease rows nobody sends).
                let acquired = tokio::select! {
                    biased;
                    _ = &mut shutdown => break 'relay,
                    conn = shared.outbox.pool().acquire() => conn,
                };
                report.passes += 1;
                next_poll = Instant::now() + config.poll_interval;
                let limit = u32::try_from(free).unwrap_or(u32::MAX);
                let claimed = match acquired {
                    Ok(mut conn) => {
                        sends
                            .claim(shared, &mut conn, &self.sender, limit, &mut report.totals)
                            .await
                    }
                    Err(e) => Err(e.into()),
                };
                match claimed {
                    Ok(claimed) => {
                        outage.recovered();
                        retry_at = None;
                        wanted = false;
                        // As many as asked: more rows are likely due.
                        backlog = claimed == u64::from(limit);
                        if backlog && slots.free(sends.len()) > 0 {
                            continue;
                        }
                    }
                    Err(e) => {
                        report.failed_passes += 1;
                        let wait = outage.failed();
                        // From the end of the failed claim, which may have waited long itself.
                        retry_at = Some(Instant::now() + wait);
                        wanted = true;
                        let failures = outage.failures();
                        if outage.should_warn() {
                            tracing::warn!(error = %e, failures, "outbox claim failed; backing off");
                        } else {
                            tracing::debug!(error = %e, failures, "outbox claim failed; backing off");
                        }
                    }
                }
            }
            if !outage.is_down() && Instant::now() >= next_purge {
                next_purge = Instant::now() + PURGE_EVERY;
                self.purge().await;
            }
            // NOTE: every moment here is in the future or acted on when it fires, so the loop
            // never spins: a claim that cannot be made now waits for a send or the next poll.
            let mut wake = next_poll;
            if let Some(at) = sends.next_retry() {
                wake = wake.min(at);
            }
            let free = slots.free(sends.len());
            if let Some(at) = retry_at.filter(|_| (wanted || backlog) && free > 0) {
                wake = wake.min(at);
            }
            tokio::select! {
                biased;
                _ = &mut shutdown => break 'relay,
                done = sends.next_done() => sends.record(done, shared, &mut report.totals).await,
                woke = recv(&mut listener) => {
                    if !woke {
                        listener = None;
                    }
                    wanted = true;
                }
                () = tokio::time::sleep_until(wake) => {
                    let now = Instant::now();
                    if sends.take_due_retries(now) {
                        wanted = true;
                    }
                    if next_poll <= now {
                        next_poll = now + config.poll_interval;
                        wanted = true;
                    }
                    if retry_at.is_some_and(|at| at <= now) {
                        wanted = true;
                    }
                }
            }
        }
        // Shutdown: no new claims; sends in flight get the grace period, then are released.
        let grace = saturating_add(Instant::now(), config.shutdown_grace);
        while !sends.is_empty() {
            tokio::select! {
                done = sends.next_done() => sends.record(done, shared, &mut report.totals).await,
                () = tokio::time::sleep_until(grace) => break,
            }
        }
        sends.release_all(shared, &mut report.totals).await;
        tracing::info!(?report, "outbox relay stopped");
        report
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
