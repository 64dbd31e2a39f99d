//! The mark of a retry attempt, and the operation's deadline in scope while it runs.

use std::cell::Cell;
use tower_once_timeout::Deadline;
use tower_service::Service;

thread_local! {
    // NOTE: set while an attempt's `call` runs (see `in_attempt`); a `Retry` called inside it
    // is nested in another one and makes a single attempt, so stacked layers do not multiply.
    static IN_ATTEMPT: Cell<bool> = const { Cell::new(false) };
}

/// Runs an attempt's `call` under the operation's deadline and the nested-retry marker.
pub(crate) fn in_attempt<R>(deadline: Deadline, call: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            IN_ATTEMPT.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(IN_ATTEMPT.with(|c| c.replace(true)));
    deadline.scope(call)
}

/// Whether this call is an attempt of an outer retry (which then does the retrying).
pub(crate) fn is_nested() -> bool {
    IN_ATTEMPT.with(Cell::get)
}

/// Marks a request sent by a retry attempt, so that a retry layer below it (even across a
/// `tower::buffer::Buffer` or a spawned task, where the thread-local mark does not reach)
/// defers to the outer one instead of multiplying attempts.
#[derive(Debug, Clone, Copy)]
pub(crate) struct InAttempt;

/// Sends a request that gets a single attempt, with the operation's deadline in its extensions
/// and in scope (for an `HttpTimeoutLayer` below), marked as inside an attempt.
pub(crate) fn call_once<S, B>(
    mut service: S,
    mut req: http::Request<B>,
    deadline: Deadline,
) -> S::Future
where
    S: Service<http::Request<B>>,
{
    req.extensions_mut().insert(deadline);
    req.extensions_mut().insert(InAttempt);
    in_attempt(deadline, || service.call(req))
}
