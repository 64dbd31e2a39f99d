//! The counters every clone of one layer shares, and their snapshot.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

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
