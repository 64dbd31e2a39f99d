//! Backing off while a dependency (Redis, Postgres) is unreachable, and logging it without
//! flooding the log.

use crate::backoff::Backoff;
use std::time::Duration;

/// Failures in a row of a loop that talks to one dependency: how long to wait before the next
/// try (100 ms doubling to at most 5 s), and which failures deserve a warning (the 1st, 2nd,
/// 4th, 8th, ...: an outage of an hour logs a dozen lines, not thousands).
///
/// ```
/// use std::time::Duration;
/// use tower_once_core::outage::Outage;
///
/// let mut outage = Outage::default();
/// let waits: Vec<_> = (0..8).map(|_| outage.failed()).collect();
/// assert_eq!(waits[0], Duration::from_millis(100));
/// assert_eq!(waits[1], Duration::from_millis(200));
/// assert_eq!(waits[7], Duration::from_secs(5), "capped");
/// assert!(outage.is_down());
/// assert_eq!(outage.recovered(), Some(8));
/// assert!(!outage.is_down());
/// ```
#[derive(Debug, Clone, Default)]
pub struct Outage {
    failures: u32,
}

impl Outage {
    /// The first wait.
    pub const FIRST: Duration = Duration::from_millis(100);
    /// The longest wait.
    pub const CAP: Duration = Duration::from_secs(5);

    /// Counts a failure; returns how long to wait before the next try.
    pub fn failed(&mut self) -> Duration {
        const WAITS: Backoff = Backoff::doubling(Outage::FIRST, Outage::CAP);
        self.failures = self.failures.saturating_add(1);
        WAITS.exponential(self.failures)
    }

    /// Counts a success: the failures in a row it ended, if there were any.
    pub fn recovered(&mut self) -> Option<u32> {
        let failures = std::mem::take(&mut self.failures);
        (failures > 0).then_some(failures)
    }

    /// Failures in a row so far.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// Whether the last try failed.
    pub fn is_down(&self) -> bool {
        self.failures > 0
    }

    /// Whether the failure just counted deserves a warning (the 1st, 2nd, 4th, 8th, ... in a
    /// row); the others are worth a debug line.
    pub fn should_warn(&self) -> bool {
        self.failures.is_power_of_two()
    }
}
