//! Outcome names and the `metrics` feature's counters: one place for both, so logs and
//! metrics use the same words.

/// How a step ended: the `outcome` label of `tower_once_step_steps_total` and the
/// `step.outcome` field of the `step` span.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Called,
    Replayed,
    Unknown,
    Mismatch,
    InProgress,
    Failed,
}

impl Outcome {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Called => "called",
            Self::Replayed => "replayed",
            Self::Unknown => "unknown",
            Self::Mismatch => "mismatch",
            Self::InProgress => "in_progress",
            Self::Failed => "failed",
        }
    }
}

#[cfg(feature = "metrics")]
pub(crate) fn outcome(outcome: Outcome) {
    metrics::counter!("tower_once_step_steps_total", "outcome" => outcome.as_str()).increment(1);
}

#[cfg(feature = "metrics")]
pub(crate) fn waited() {
    metrics::counter!("tower_once_step_waits_total").increment(1);
}

#[cfg(not(feature = "metrics"))]
pub(crate) fn outcome(_: Outcome) {}

#[cfg(not(feature = "metrics"))]
pub(crate) fn waited() {}
