//! The relay's loop: a pass whenever rows may be due (a `NOTIFY` on insert, or the poll
//! interval), backoff while Postgres is away, sent rows purged now and then.

use super::{pass, OutboxRelay, RelayReport};
use crate::message::OutboxMessage;
use sqlx::postgres::{PgListener, PgPoolOptions};
use std::fmt;
use std::future::Future;
use std::time::Duration;
use tokio::time::Instant;
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
    /// It wakes on the table's `NOTIFY` (sent by the insert trigger when a transaction that
    /// enqueued commits), at least every `poll_interval` (rows backing off become due, a
    /// notification can be missed while reconnecting), and at once while passes come back full.
    pub async fn run<F: Future>(self, shutdown: F) -> RelayReport {
        let mut shutdown = std::pin::pin!(shutdown);
        let mut stopping = false;
        let mut report = RelayReport::default();
        let mut listener: Option<PgListener> = None;
        let mut failures = 0u32;
        let mut next_purge = Instant::now();
        let config = &self.shared.config;
        tracing::info!(
            table = self.shared.outbox.table_name(),
            "outbox relay started"
        );
        while !stopping {
            if listener.is_none() {
                listener = self.listen().await;
            }
            report.passes += 1;
            let mut wait = config.poll_interval;
            match pass::run(&self.shared, &self.sender, shutdown.as_mut(), &mut stopping).await {
                Ok(done) => {
                    failures = 0;
                    report.totals.add(done);
                    if done.claimed == u64::from(config.batch_size) {
                        wait = Duration::ZERO;
                    }
                }
                Err(e) => {
                    failures = failures.saturating_add(1);
                    report.failed_passes += 1;
                    wait = Duration::from_millis(100)
                        .saturating_mul(1 << failures.min(6))
                        .min(Duration::from_secs(5));
                    if failures.is_power_of_two() {
                        tracing::warn!(error = %e, failures, "outbox pass failed; backing off");
                    }
                }
            }
            if failures == 0 && Instant::now() >= next_purge {
                next_purge = Instant::now() + PURGE_EVERY;
                self.purge().await;
            }
            if stopping || wait.is_zero() {
                continue;
            }
            tokio::select! {
                _ = &mut shutdown => stopping = true,
                () = tokio::time::sleep(wait) => {}
                woke = recv(&mut listener) => {
                    if !woke {
                        listener = None;
                    }
                }
            }
        }
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
