//! The `metrics` feature's counter, in one place: `tower_once_timeout_timeouts_total{bound,
//! layer}`, where `bound` is `limit` or `deadline` and `layer` is `timeout`, `http_body` or
//! `server`.

/// Counts one expiry.
#[inline]
pub(crate) fn timed_out(deadline: bool, layer: &'static str) {
    #[cfg(feature = "metrics")]
    metrics::counter!(
        "tower_once_timeout_timeouts_total",
        "bound" => if deadline { "deadline" } else { "limit" },
        "layer" => layer
    )
    .increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = (deadline, layer);
}
