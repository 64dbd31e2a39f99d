//! How a covered request ended, and the `metrics` feature's counter of it, in one place: the
//! `outcome` field of the `idempotency` span and `tower_once_idempotency_requests_total{outcome}`
//! use the same words.

use tracing::Span;

/// The final outcome of a covered request: the `outcome` field of the `idempotency` span and
/// the label of `tower_once_idempotency_requests_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The handler's response was stored for replay.
    Stored,
    /// The key was released (the response is not stored, the handler failed or gave up).
    Released,
    /// A stored response was replayed.
    Replayed,
    /// The key is held by a request still running, or by a not-replayable record.
    Conflict,
    /// The key was used with another request.
    Mismatch,
    /// The layer refused the request (bad key, body too large, body error).
    Rejected,
    /// The response was too large to store; duplicates get an error.
    NotReplayable,
    /// The store failed and the request was refused (fail-closed).
    Unavailable,
    /// The store failed and the request ran without a claim (fail-open).
    Unclaimed,
}

impl Outcome {
    /// The stable name used in logs and metrics.
    pub(crate) const fn as_str(self) -> &'static str {
        match self {
            Self::Stored => "stored",
            Self::Released => "released",
            Self::Replayed => "replayed",
            Self::Conflict => "conflict",
            Self::Mismatch => "mismatch",
            Self::Rejected => "rejected",
            Self::NotReplayable => "not_replayable",
            Self::Unavailable => "unavailable",
            Self::Unclaimed => "unclaimed",
        }
    }

    /// Records the outcome on `span` and, with the `metrics` feature, in
    /// `tower_once_idempotency_requests_total{outcome}`.
    pub(crate) fn record(self, span: &Span) {
        span.record("outcome", self.as_str());
        self.count();
    }

    /// Counts the outcome only (for rejections made before a span exists).
    pub(crate) fn count(self) {
        #[cfg(feature = "metrics")]
        metrics::counter!("tower_once_idempotency_requests_total", "outcome" => self.as_str())
            .increment(1);
    }
}
