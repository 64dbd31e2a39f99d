//! The error of [`RunOnce`](super::RunOnce).

use std::fmt;
use tower_once_idempotency::store::StoreError;

/// Why [`RunOnce`](super::RunOnce) returned no outcome: the handler's error, the same entry
/// running elsewhere, the store, or a handler's transaction that rolled back.
#[derive(Debug)]
pub struct RunOnceError<E>(pub(super) Repr<E>);

#[derive(Debug)]
pub(super) enum Repr<E> {
    Inner(E),
    InProgress,
    Store(StoreError),
    // The handler returned `Ok`, but its transaction rolled back the record and its effects.
    RolledBack,
}

impl<E> RunOnceError<E> {
    pub(crate) fn inner(e: E) -> Self {
        Self(Repr::Inner(e))
    }

    /// The handler ran and failed (its claim was released, so a redelivery runs it again).
    pub fn is_inner(&self) -> bool {
        matches!(self.0, Repr::Inner(_))
    }

    /// This very queue entry (the same [`delivery`](super::Delivery::delivery)) is running
    /// elsewhere, redelivered while it runs: the handler did not run, and the entry is to be
    /// left pending (another entry with the same key is a duplicate instead).
    pub fn is_in_progress(&self) -> bool {
        matches!(self.0, Repr::InProgress)
    }

    /// The store failed (the handler did not run), or the handler ran and returned `Ok` but
    /// whether its transaction committed its record is not known (still open after a third of
    /// the lease, or the read failed): either way the entry is to be left pending, and the
    /// record decides its next delivery.
    pub fn is_store(&self) -> bool {
        matches!(self.0, Repr::Store(_))
    }

    /// The handler returned `Ok`, but its transaction rolled back the record it wrote, and
    /// its effects with it: the claim is released and the message runs again.
    pub fn is_rolled_back(&self) -> bool {
        matches!(self.0, Repr::RolledBack)
    }

    /// The handler's error.
    pub fn get_inner(&self) -> Option<&E> {
        match &self.0 {
            Repr::Inner(e) => Some(e),
            _ => None,
        }
    }

    /// The handler's error, consuming this one.
    pub fn into_inner(self) -> Option<E> {
        match self.0 {
            Repr::Inner(e) => Some(e),
            _ => None,
        }
    }
}

impl<E: fmt::Display> fmt::Display for RunOnceError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Repr::Inner(e) => fmt::Display::fmt(e, f),
            Repr::InProgress => f.write_str("this entry is running in another delivery"),
            Repr::RolledBack => f.write_str(
                "the handler returned Ok but its transaction rolled back the run's record (and its effects): left to run again",
            ),
            Repr::Store(e) => write!(f, "run-once store: {e}"),
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for RunOnceError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.0 {
            Repr::Inner(e) => Some(e),
            Repr::InProgress | Repr::RolledBack => None,
            Repr::Store(e) => Some(e),
        }
    }
}
