//! The `metrics` feature's gauges and counters, in one place (names in the crate docs).

use crate::CircuitState;

/// `tower_once_breaker_transitions_total{to}` and `tower_once_breaker_state{circuit}`.
#[inline]
pub(crate) fn transition(circuit: &str, to: CircuitState) {
    #[cfg(feature = "metrics")]
    {
        metrics::counter!("tower_once_breaker_transitions_total", "to" => to.as_str()).increment(1);
        metrics::gauge!("tower_once_breaker_state", "circuit" => circuit.to_owned())
            .set(f64::from(to.code()));
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (circuit, to);
}

/// `tower_once_breaker_refusals_total{state}`.
#[inline]
pub(crate) fn refusal(state: CircuitState) {
    #[cfg(feature = "metrics")]
    metrics::counter!("tower_once_breaker_refusals_total", "state" => state.as_str()).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = state;
}

/// `tower_once_breaker_circuits`: keyed circuits held now.
#[inline]
pub(crate) fn circuits(count: usize) {
    #[cfg(feature = "metrics")]
    metrics::gauge!("tower_once_breaker_circuits").set(count as f64);
    #[cfg(not(feature = "metrics"))]
    let _ = count;
}
