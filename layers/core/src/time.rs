//! Clock arithmetic that never panics on a configured or peer-sent duration.

use std::time::Duration;
use tokio::time::Instant;

/// The longest span any layer works with (about 100 years): longer leases, retentions,
/// deadlines and limits are cut to it, so that no clock arithmetic and no store's expiry
/// overflows.
pub const MAX_DURATION: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// `now + span`, saturating at [`MAX_DURATION`] from now instead of panicking (on
/// `Duration::MAX`, say).
///
/// ```
/// use std::time::Duration;
/// use tower_once_core::time::{saturating_add, MAX_DURATION};
///
/// let now = tokio::time::Instant::now();
/// assert_eq!(saturating_add(now, Duration::MAX), now + MAX_DURATION);
/// assert_eq!(saturating_add(now, Duration::from_secs(1)), now + Duration::from_secs(1));
/// ```
#[inline]
pub fn saturating_add(now: Instant, span: Duration) -> Instant {
    // One checked addition; `now` itself only if the clock is within 100 years of its end.
    now.checked_add(span.min(MAX_DURATION)).unwrap_or(now)
}
