//! The `metrics` feature's counters, in one place (names in the crate docs).

use crate::rule::Reason;

/// `tower_once_fallback_fallbacks_total{reason}`.
#[inline]
pub(crate) fn fallback(reason: Reason) {
    #[cfg(feature = "metrics")]
    metrics::counter!("tower_once_fallback_fallbacks_total", "reason" => reason.as_str())
        .increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = reason;
}

/// `tower_once_fallback_withheld_total`: failed requests kept from the secondary because they
/// may have run.
#[inline]
pub(crate) fn withheld() {
    #[cfg(feature = "metrics")]
    metrics::counter!("tower_once_fallback_withheld_total").increment(1);
}
