//! Watching retries: a hook called before each wait, and counters.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// What the [`OnRetry`] hook is told before each wait.
#[derive(Debug)]
#[non_exhaustive]
pub struct RetryEvent<'a, Res, E> {
    /// The attempt that just failed (1 is the first).
    pub attempt: u32,
    /// How long the layer will wait before the next attempt.
    pub delay: Duration,
    /// Whether the delay came from the server (`Retry-After`, gRPC pushback) rather than the
    /// backoff.
    pub from_server: bool,
    /// Whether a circuit breaker below refused the attempt before sending it: the delay is
    /// then the time until the circuit admits a probe.
    pub refused: bool,
    /// The failed attempt's outcome.
    pub outcome: &'a Result<Res, E>,
}

/// Called before each retry's wait. Implemented for closures `Fn(&RetryEvent<'_, Res, E>)` and,
/// as a no-op, for `()`.
///
/// The layer clones its hook (and its classifier): once for each service it makes, and once
/// for each of up to 8 worker threads, so that no call shares a reference count with calls on
/// other cores. Keep anything a hook accumulates behind an `Arc`, as in the closure below.
///
/// ```
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use std::sync::Arc;
/// use tower_once_retry::hook::{OnRetry, RetryEvent};
///
/// let retries = Arc::new(AtomicU64::new(0));
/// let counted = Arc::clone(&retries);
/// let log = move |event: &RetryEvent<'_, u16, ()>| {
///     counted.fetch_add(1, Ordering::Relaxed);
///     eprintln!("attempt {} got {:?}; retrying in {:?}", event.attempt, event.outcome, event.delay);
/// };
/// # let _ = log;
/// ```
pub trait OnRetry<Res, E> {
    /// Called before waiting for the next attempt.
    fn on_retry(&self, event: &RetryEvent<'_, Res, E>);
}

impl<Res, E> OnRetry<Res, E> for () {
    fn on_retry(&self, _: &RetryEvent<'_, Res, E>) {}
}

impl<F, Res, E> OnRetry<Res, E> for F
where
    F: Fn(&RetryEvent<'_, Res, E>),
{
    fn on_retry(&self, event: &RetryEvent<'_, Res, E>) {
        self(event)
    }
}

/// Counters shared by every clone of one layer; read them with
/// [`RetryLayer::stats`](crate::RetryLayer::stats).
#[derive(Debug, Default)]
pub struct Stats {
    // Updated on every call: sharded per thread, so cores do not contend for one counter.
    pub(crate) operations: tower_once_core::shard::Counter,
    pub(crate) attempts: tower_once_core::shard::Counter,
    pub(crate) retries: AtomicU64,
    pub(crate) budget_refusals: AtomicU64,
    pub(crate) give_ups: AtomicU64,
}

/// A snapshot of [`Stats`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct StatsSnapshot {
    /// Logical operations started (first attempts).
    pub operations: u64,
    /// Calls of the inner service, first attempts included.
    pub attempts: u64,
    /// Retries made (waits started).
    pub retries: u64,
    /// Retries the budget refused.
    pub budget_refusals: u64,
    /// Operations that ended on a retryable outcome without succeeding (limit, deadline,
    /// budget).
    pub give_ups: u64,
}

impl Stats {
    /// The counters now.
    pub fn snapshot(&self) -> StatsSnapshot {
        StatsSnapshot {
            operations: self.operations.sum(),
            attempts: self.attempts.sum(),
            retries: self.retries.load(Relaxed),
            budget_refusals: self.budget_refusals.load(Relaxed),
            give_ups: self.give_ups.load(Relaxed),
        }
    }

    /// An operation started (its first attempt is counted by [`attempt`](Self::attempt)).
    pub(crate) fn operation(&self) {
        self.operations.increment();
        crate::metrics::operation();
    }

    /// The inner service was called.
    pub(crate) fn attempt(&self) {
        self.attempts.increment();
        crate::metrics::attempt();
    }

    /// A retry was scheduled after `delay`.
    pub(crate) fn retry(&self, delay: std::time::Duration) {
        self.retries.fetch_add(1, Relaxed);
        crate::metrics::retry(delay);
    }

    /// The budget refused a retry (a give-up is counted too).
    pub(crate) fn budget_refusal(&self) {
        self.budget_refusals.fetch_add(1, Relaxed);
        crate::metrics::budget_refusal();
    }

    /// An operation ended on a retryable outcome without succeeding.
    pub(crate) fn give_up(&self, reason: crate::GiveUp) {
        self.give_ups.fetch_add(1, Relaxed);
        crate::metrics::give_up(reason);
    }
}
