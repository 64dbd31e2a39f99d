//! The mark of a retry attempt, and the operation's deadline, as they reach the layers below:
//! in scope on the thread while an attempt is called and polled, and on the request itself for
//! request types that carry them ([`Carrier`]). The mark is `tower_once_core`'s [`Attempt`], so
//! a layer of another crate (the circuit breaker) reads it too, and reports back through it
//! when it refused the attempt ([`Refused`]).

use tower_once_core::attempt::{Attempt, Refused};
use tower_once_core::carrier::Carrier;
use tower_once_timeout::Deadline;
use tower_service::Service;

/// Runs `f` (an attempt's `call`, or a poll of its future) under the operation's deadline and
/// the attempt's mark; returns what `f` returned and the refusal a layer below reported.
pub(crate) fn in_attempt<R>(
    attempt: Attempt,
    deadline: Deadline,
    f: impl FnOnce() -> R,
) -> (R, Option<Refused>) {
    attempt.scope(|| deadline.scope(f))
}

/// Whether this runs inside an attempt of an outer retry (which then does the retrying).
pub(crate) fn is_nested() -> bool {
    Attempt::current().is_some()
}

/// Whether `request` was sent by an outer retry's attempt, or is called inside one.
pub(crate) fn is_marked<R: Carrier>(request: &R) -> bool {
    Attempt::of(request).is_some()
}

/// Puts the attempt's mark and its operation's deadline on `request`, if it carries them.
pub(crate) fn mark<R: Carrier>(request: &mut R, attempt: Attempt, deadline: Deadline) {
    deadline.attach(request);
    attempt.attach(request);
}

/// Sends a request that gets a single attempt: marked (with the outer retry's attempt when it
/// is nested in one), with the operation's deadline on it and in scope (for a timeout layer
/// below).
pub(crate) fn call_once<S, R>(mut service: S, mut request: R, deadline: Deadline) -> S::Future
where
    S: Service<R>,
    R: Carrier,
{
    let attempt = Attempt::of(&request).unwrap_or(Attempt::FIRST);
    mark(&mut request, attempt, deadline);
    in_attempt(attempt, deadline, || service.call(request)).0
}
