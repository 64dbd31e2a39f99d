//! The `metrics` feature's counters, in one place (names in the crate docs).

/// `tower_once_hedge_hedges_total`.
#[inline]
pub(crate) fn hedge() {
    #[cfg(feature = "metrics")]
    metrics::counter!("tower_once_hedge_hedges_total").increment(1);
}

/// `tower_once_hedge_wins_total`: a hedge answered first.
#[inline]
pub(crate) fn win() {
    #[cfg(feature = "metrics")]
    metrics::counter!("tower_once_hedge_wins_total").increment(1);
}

/// `tower_once_hedge_budget_refusals_total`.
#[inline]
pub(crate) fn budget_refusal() {
    #[cfg(feature = "metrics")]
    metrics::counter!("tower_once_hedge_budget_refusals_total").increment(1);
}
