//! Outcome names and the `metrics` feature's counters: one place for both, so logs and
//! metrics use the same words.

/// How one delivery ended: the `outcome` field of the `job` span.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum JobOutcome {
    /// The handler succeeded; the entry was acknowledged.
    Acked,
    /// The handler failed transiently (or its deadline passed): the entry stays pending.
    LeftPending,
    /// The entry went to the dead-letter stream.
    DeadLettered,
    /// Shutdown's grace period ended first: the handler was dropped, the entry stays pending.
    Abandoned,
}

impl JobOutcome {
    /// A stable name: `acked`, `left_pending`, `dead_lettered`, `abandoned`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Acked => "acked",
            Self::LeftPending => "left_pending",
            Self::DeadLettered => "dead_lettered",
            Self::Abandoned => "abandoned",
        }
    }
}

#[cfg(feature = "metrics")]
mod imp {
    pub(crate) fn processed() {
        metrics::counter!("tower_once_worker_processed_total").increment(1);
    }
    pub(crate) fn failed() {
        metrics::counter!("tower_once_worker_failed_total").increment(1);
    }
    pub(crate) fn redelivered() {
        metrics::counter!("tower_once_worker_redelivered_total").increment(1);
    }
    pub(crate) fn dead_lettered(reason: &'static str) {
        metrics::counter!("tower_once_worker_dead_lettered_total", "reason" => reason).increment(1);
    }
    pub(crate) fn in_flight(delta: f64) {
        metrics::gauge!("tower_once_worker_in_flight").increment(delta);
    }
    pub(crate) fn group_lag(lag: u64) {
        metrics::gauge!("tower_once_worker_group_lag").set(lag as f64);
    }
    pub(crate) const GROUP_LAG: bool = true;
}

#[cfg(not(feature = "metrics"))]
mod imp {
    pub(crate) fn processed() {}
    pub(crate) fn failed() {}
    pub(crate) fn redelivered() {}
    pub(crate) fn dead_lettered(_reason: &'static str) {}
    pub(crate) fn in_flight(_delta: f64) {}
    pub(crate) fn group_lag(_lag: u64) {}
    pub(crate) const GROUP_LAG: bool = false;
}

pub(crate) use imp::*;
