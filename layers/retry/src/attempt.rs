//! The mark of a retry attempt, and the operation's deadline, as they reach the layers below:
//! in scope on the thread while an attempt is called and polled, and on the request itself for
//! request types that carry them ([`Carrier`]).

use std::cell::Cell;
use tower_once_core::carrier::Carrier;
use tower_once_timeout::Deadline;
use tower_service::Service;

thread_local! {
    // NOTE: set while an attempt's `call` runs and while its future is polled (see
    // `in_attempt`); a `Retry` called or first polled inside it is nested in another one and
    // makes a single attempt, so stacked layers do not multiply.
    static IN_ATTEMPT: Cell<bool> = const { Cell::new(false) };
}

/// Marks a request sent by a retry attempt, so that a retry layer below it (even on another
/// task, where the thread-local mark does not reach) defers to the outer one instead of
/// multiplying attempts.
#[derive(Debug, Clone, Copy)]
pub(crate) struct InAttempt;

/// Runs `f` (an attempt's `call`, or a poll of its future) under the operation's deadline and
/// the nested-retry mark.
pub(crate) fn in_attempt<R>(deadline: Deadline, f: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            IN_ATTEMPT.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(IN_ATTEMPT.with(|c| c.replace(true)));
    deadline.scope(f)
}

/// Whether this runs inside an attempt of an outer retry (which then does the retrying).
pub(crate) fn is_nested() -> bool {
    IN_ATTEMPT.with(Cell::get)
}

/// Whether `request` was sent by an outer retry's attempt, or is called inside one.
pub(crate) fn is_marked<R: Carrier>(request: &R) -> bool {
    is_nested()
        || request
            .extensions()
            .is_some_and(|e| e.get::<InAttempt>().is_some())
}

/// Puts the attempt's mark and its operation's deadline on `request`, if it carries them.
pub(crate) fn mark<R: Carrier>(request: &mut R, deadline: Deadline) {
    deadline.attach(request);
    if let Some(extensions) = request.extensions_mut() {
        extensions.insert(InAttempt);
    }
}

/// Sends a request that gets a single attempt: marked, with the operation's deadline on it
/// and in scope (for a timeout layer below).
pub(crate) fn call_once<S, R>(mut service: S, mut request: R, deadline: Deadline) -> S::Future
where
    S: Service<R>,
    R: Carrier,
{
    mark(&mut request, deadline);
    in_attempt(deadline, || service.call(request))
}
