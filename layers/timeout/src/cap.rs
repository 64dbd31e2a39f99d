//! How long one call may take: the smaller of its limit and what is left of its deadline.

use crate::error::Elapsed;
use crate::Deadline;
use std::time::Duration;
use tokio::time::Instant;

/// How long a call may take: the smaller of the limit and what is left of the deadline.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Cap {
    pub(crate) until: Instant,
    pub(crate) elapsed: Elapsed,
    spent: bool,
}

impl Cap {
    /// Reads the clock once: it is the main cost of a timeout on the happy path.
    #[inline]
    pub(crate) fn new(limit: Duration, deadline: Option<Deadline>) -> Self {
        let now = Instant::now();
        let end = tower_once_core::time::saturating_add(now, limit);
        match deadline {
            Some(deadline) if deadline.instant() < end => Self {
                until: deadline.instant(),
                elapsed: Elapsed::new(deadline.instant().saturating_duration_since(now), true),
                spent: deadline.instant() <= now,
            },
            _ => Self {
                until: end,
                elapsed: Elapsed::new(limit, false),
                spent: limit.is_zero(),
            },
        }
    }

    /// Whether nothing is left: the inner service must not be called at all.
    pub(crate) fn is_spent(&self) -> bool {
        self.spent
    }
}
