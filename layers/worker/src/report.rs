//! What a run of the worker did.

use crate::metrics::JobOutcome;

/// What a [`Worker::run`](crate::Worker::run) did, by [`JobOutcome`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RunReport {
    /// Deliveries acknowledged.
    pub acked: u64,
    /// Deliveries left pending (transient failures, missed deadlines).
    pub left_pending: u64,
    /// Deliveries dead-lettered.
    pub dead_lettered: u64,
    /// Deliveries dropped when the shutdown grace ended (left pending).
    pub abandoned: u64,
}

impl RunReport {
    pub(crate) fn record(&mut self, done: Result<JobOutcome, tokio::task::JoinError>) {
        match done {
            Ok(JobOutcome::Acked) => self.acked += 1,
            Ok(JobOutcome::DeadLettered) => self.dead_lettered += 1,
            Ok(JobOutcome::Abandoned) => self.abandoned += 1,
            // A handler that panicked never acknowledged: its entry is pending.
            Ok(JobOutcome::LeftPending) | Err(_) => self.left_pending += 1,
        }
    }
}
