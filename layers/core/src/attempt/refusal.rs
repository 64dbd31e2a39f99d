//! The refusal protocol: a layer below that refuses an attempt before sending it (an open
//! circuit) reports it in the attempt's scope, and the retry layer reads it there.

use super::SCOPE;
use std::time::Duration;

/// A layer below refused an attempt before sending anything (its circuit is open): the request
/// certainly did not run, and [`retry_after`](Self::retry_after) says when the dependency may
/// be tried again, when known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refused {
    retry_after: Option<Duration>,
}

impl Refused {
    /// A refusal; `retry_after` is when a new try may be admitted, `None` when unknown.
    pub const fn new(retry_after: Option<Duration>) -> Self {
        Self { retry_after }
    }

    /// When a new try may be admitted, if known.
    pub const fn retry_after(self) -> Option<Duration> {
        self.retry_after
    }
}

#[doc(hidden)]
/// Reports that the attempt in scope was refused before it was sent. Nothing happens outside
/// an attempt's scope.
pub fn refuse(refused: Refused) {
    SCOPE.with(|s| {
        let mut scope = s.get();
        if scope.attempt.is_some() {
            scope.refused = Some(refused);
            s.set(scope);
        }
    });
}

#[doc(hidden)]
/// Takes back a refusal reported in the attempt in scope: for a layer that went on after it
/// (a fallback that sent the request elsewhere), so that the attempt's outcome is not taken
/// for the refusal.
pub fn withdraw_refusal() {
    SCOPE.with(|s| {
        let mut scope = s.get();
        if scope.refused.take().is_some() {
            s.set(scope);
        }
    });
}
