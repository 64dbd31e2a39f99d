//! The `metrics` feature's counters and histogram, in one place (names in the crate docs):
//! [`Stats`](crate::hook::Stats) calls these beside its own counters.

use crate::GiveUp;
use std::time::Duration;

/// `tower_once_retry_operations_total`.
#[inline]
pub(crate) fn operation() {
    #[cfg(feature = "metrics")]
    metrics::counter!("tower_once_retry_operations_total").increment(1);
}

/// `tower_once_retry_attempts_total`.
#[inline]
pub(crate) fn attempt() {
    #[cfg(feature = "metrics")]
    metrics::counter!("tower_once_retry_attempts_total").increment(1);
}

/// `tower_once_retry_retries_total` and the wait in `tower_once_retry_delay_seconds`.
#[inline]
pub(crate) fn retry(delay: Duration) {
    #[cfg(feature = "metrics")]
    {
        metrics::counter!("tower_once_retry_retries_total").increment(1);
        metrics::histogram!("tower_once_retry_delay_seconds").record(delay.as_secs_f64());
    }
    #[cfg(not(feature = "metrics"))]
    let _ = delay;
}

/// `tower_once_retry_budget_refusals_total`.
#[inline]
pub(crate) fn budget_refusal() {
    #[cfg(feature = "metrics")]
    metrics::counter!("tower_once_retry_budget_refusals_total").increment(1);
}

/// `tower_once_retry_give_ups_total{reason}`.
#[inline]
pub(crate) fn give_up(reason: GiveUp) {
    #[cfg(feature = "metrics")]
    metrics::counter!("tower_once_retry_give_ups_total", "reason" => reason.as_str()).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = reason;
}
