//! A step layer's settings and their defaults.

use std::time::Duration;

/// Default lease of a step in progress: renewed every third of it while the call runs, so a
/// dead owner's step is taken over (or settled as unknown) within one lease.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(10);
/// Default retention of a step's record.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);
/// Default bound on waiting for a step running elsewhere, when the request carries no
/// deadline and none is in scope.
pub const DEFAULT_MAX_WAIT: Duration = Duration::from_secs(60);
/// Default limit on an encoded result: a larger one is returned but not stored.
pub const DEFAULT_RESULT_LIMIT: usize = 1024 * 1024;

#[derive(Debug, Clone)]
pub(crate) struct Settings<St, C, K, V> {
    pub(crate) store: St,
    pub(crate) codec: C,
    pub(crate) classifier: K,
    pub(crate) verify: V,
    pub(crate) lease: Duration,
    pub(crate) retention: Duration,
    pub(crate) max_wait: Duration,
    pub(crate) result_limit: usize,
    pub(crate) scoped: bool,
}
