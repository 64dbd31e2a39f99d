//! The plan of an operation's hedges: what is copied, when, how many times, until when.

use std::time::Duration;
use tower_once_core::attempt::Attempt;
use tower_once_core::deadline::Deadline;

/// Makes the copies of a request that hedges send: the same request, the same key.
pub trait Copies<Req> {
    /// One more copy.
    fn copy(&self) -> Req;
}

/// A `Clone` request, copied by cloning it.
#[derive(Debug, Clone)]
pub struct Cloned<Req>(pub(crate) Req);

impl<Req: Clone> Copies<Req> for Cloned<Req> {
    fn copy(&self) -> Req {
        self.0.clone()
    }
}

/// Hedges still to send for an operation.
pub(crate) struct Plan<S, K> {
    pub(crate) source: K,
    pub(crate) delay: Duration,
    pub(crate) left: u32,
    pub(crate) deadline: Option<Deadline>,
    /// The mark hedges carry: the attempt they copy, as a hedge.
    pub(crate) mark: Attempt,
    /// A clone of the inner service, made for the first hedge.
    pub(crate) service: Option<S>,
}
