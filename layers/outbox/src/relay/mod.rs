//! The relay: claims due rows under a lease, sends them through a `tower::Service`, and records
//! what happened.

mod pass;
mod run;
mod schedule;
mod send;

use crate::classify::{Classify, SendClassifier};
use crate::config::RelayConfig;
use crate::error::OutboxError;
use crate::message::OutboxMessage;
use crate::outbox::Outbox;
use std::fmt;
use std::sync::Arc;
use tower_service::Service;

/// Sends an [`Outbox`]'s rows through a `tower::Service<OutboxMessage>`.
///
/// It keeps up to `batch_size` sends in flight: it claims due rows into the free slots (once a
/// quarter of them is free) in one short statement (`FOR UPDATE SKIP LOCKED`, then a lease written on them), sends them
/// concurrently, and records each outcome as it comes. No row lock is held across a send and
/// no send waits for another: a slow or hanging provider holds only its own slots (at most
/// `send_timeout` each), several relays share the work, and a dead relay's rows come back when
/// their lease runs out. See the [crate docs](crate) for the full table.
///
/// The sender's outcome is classified with the retry crate's [`Classify`]: the default,
/// [`SendClassifier`], counts `Ok` as sent, follows the verdict an
/// [`HttpSendError`](crate::http::HttpSendError) carries and retries every other `Err`. A
/// classifier that returns `Action::Stop` parks the row at once (a provider's `400`), and
/// `Action::Retry { after }` schedules the next attempt after the provider's delay
/// (`Retry-After`).
pub struct OutboxRelay<S, C = SendClassifier> {
    shared: Arc<Shared<C>>,
    sender: S,
}

/// What every send task reads.
pub(crate) struct Shared<C> {
    pub(crate) outbox: Outbox,
    pub(crate) config: RelayConfig,
    pub(crate) classifier: C,
}

impl<S> OutboxRelay<S> {
    /// A relay for `outbox` sending through `sender`.
    ///
    /// Fails, with [`OutboxError::is_config`], on settings that cannot work.
    pub fn new(outbox: Outbox, config: RelayConfig, sender: S) -> Result<Self, OutboxError> {
        config.validate()?;
        Ok(Self {
            shared: Arc::new(Shared {
                outbox,
                config,
                classifier: SendClassifier,
            }),
            sender,
        })
    }
}

impl<S, C> OutboxRelay<S, C> {
    /// Classifies the sender's outcomes with `classifier` instead.
    pub fn classify<C2>(self, classifier: C2) -> OutboxRelay<S, C2> {
        let shared = Arc::new(Shared {
            outbox: self.shared.outbox.clone(),
            config: self.shared.config.clone(),
            classifier,
        });
        OutboxRelay {
            shared,
            sender: self.sender,
        }
    }

    /// The settings.
    pub fn config(&self) -> &RelayConfig {
        &self.shared.config
    }
}

impl<S, C> OutboxRelay<S, C>
where
    S: Service<OutboxMessage> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
    S::Error: fmt::Display + Send + 'static,
    C: Classify<S::Response, S::Error> + Send + Sync + 'static,
{
    /// One pass: claims up to `batch_size` due rows, sends them concurrently and records each
    /// outcome. Returns when every send has finished. For tests and cron-style deployments;
    /// [`run`](Self::run) does not wait for a whole batch: it refills the slots finished sends
    /// free.
    pub async fn pass(&self) -> Result<PassReport, OutboxError> {
        let mut sends = pass::Sends::new();
        let mut report = PassReport::default();
        let batch = self.shared.config.batch_size;
        let mut conn = self.shared.outbox.pool().acquire().await?;
        sends
            .claim(&self.shared, &mut conn, &self.sender, batch, &mut report)
            .await?;
        drop(conn);
        while !sends.is_empty() {
            let done = sends.next_done().await;
            sends.record(done, &self.shared, &mut report).await;
        }
        Ok(report)
    }
}

impl<S: fmt::Debug, C> fmt::Debug for OutboxRelay<S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OutboxRelay")
            .field("table", &self.shared.outbox.table_name())
            .field("config", &self.shared.config)
            .field("sender", &self.sender)
            .field("classifier", &std::any::type_name::<C>())
            .finish()
    }
}

/// What one [`pass`](OutboxRelay::pass) did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PassReport {
    /// Rows claimed.
    pub claimed: u64,
    /// Sent (recorded or not).
    pub sent: u64,
    /// Failed and scheduled again.
    pub failed: u64,
    /// Parked for a person.
    pub parked: u64,
    /// Released at shutdown, or lost to another relay after the lease.
    pub released: u64,
}

/// What [`run`](OutboxRelay::run) did before it stopped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RelayReport {
    /// Claims made (each fills the free send slots).
    pub passes: u64,
    /// Claims that failed (Postgres unreachable), each followed by a backoff.
    pub failed_passes: u64,
    /// What happened to the rows, over the whole run.
    pub totals: PassReport,
}
