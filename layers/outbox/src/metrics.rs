//! What the relay did with a row, for logs and (with the `metrics` feature) counters.

/// What one relay attempt did with one row: the `outcome` field of the `outbox_send` span
/// and the label of `tower_once_outbox_sends_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SendOutcome {
    /// Sent and recorded as sent.
    Sent,
    /// Sent, but recording it failed: it is sent again after the lease, with the same key.
    SentUnrecorded,
    /// The send failed; retried after a backoff.
    Failed,
    /// The send failed for good, or too often: parked for a person.
    Parked,
    /// Its lease ran out and another relay holds the row now: nothing recorded.
    LeaseLost,
    /// Shutdown cut the send: the row was released for another pass.
    Released,
}

impl SendOutcome {
    /// A stable lowercase name.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Sent => "sent",
            Self::SentUnrecorded => "sent_unrecorded",
            Self::Failed => "failed",
            Self::Parked => "parked",
            Self::LeaseLost => "lease_lost",
            Self::Released => "released",
        }
    }
}

#[cfg(feature = "metrics")]
pub(crate) fn record(outcome: SendOutcome) {
    metrics::counter!("tower_once_outbox_sends_total", "outcome" => outcome.as_str()).increment(1);
}

#[cfg(feature = "metrics")]
pub(crate) fn record_many(outcome: SendOutcome, rows: u64) {
    metrics::counter!("tower_once_outbox_sends_total", "outcome" => outcome.as_str())
        .increment(rows);
}

#[cfg(not(feature = "metrics"))]
pub(crate) fn record(_: SendOutcome) {}

#[cfg(not(feature = "metrics"))]
pub(crate) fn record_many(_: SendOutcome, _: u64) {}
