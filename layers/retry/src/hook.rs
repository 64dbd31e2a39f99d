//! Watching retries: a hook called before each wait, and counters.

use std::time::Duration;

pub use crate::stats::{Stats, StatsSnapshot};

/// What the [`OnRetry`] hook is told before each wait.
#[derive(Debug)]
#[non_exhaustive]
pub struct RetryEvent<'a, Res, E> {
    /// The attempt that just failed (1 is the first).
    pub attempt: u32,
    /// How long the layer will wait before the next attempt.
    pub delay: Duration,
    /// Whether the delay came from the server (`Retry-After`, gRPC pushback) rather than the
    /// backoff.
    pub from_server: bool,
    /// Whether a circuit breaker below refused the attempt before sending it: the delay is
    /// then the time until the circuit admits a probe.
    pub refused: bool,
    /// The failed attempt's outcome.
    pub outcome: &'a Result<Res, E>,
}

/// Called before each retry's wait. Implemented for closures `Fn(&RetryEvent<'_, Res, E>)` and,
/// as a no-op, for `()`.
///
/// The layer clones its hook (and its classifier): once for each service it makes, and once
/// for each of up to 8 worker threads, so that no call shares a reference count with calls on
/// other cores. Keep anything a hook accumulates behind an `Arc`, as in the closure below.
///
/// A hook is an observer: one that panics is caught and logged (`error`), and the layer goes
/// on as if it had returned, so a bug in it never leaks what the layer holds at that moment.
///
/// ```
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use std::sync::Arc;
/// use tower_once_retry::hook::{OnRetry, RetryEvent};
///
/// let retries = Arc::new(AtomicU64::new(0));
/// let counted = Arc::clone(&retries);
/// let log = move |event: &RetryEvent<'_, u16, ()>| {
///     counted.fetch_add(1, Ordering::Relaxed);
///     eprintln!("attempt {} got {:?}; retrying in {:?}", event.attempt, event.outcome, event.delay);
/// };
/// # let _ = log;
/// ```
pub trait OnRetry<Res, E> {
    /// Called before waiting for the next attempt.
    fn on_retry(&self, event: &RetryEvent<'_, Res, E>);
}

impl<Res, E> OnRetry<Res, E> for () {
    fn on_retry(&self, _: &RetryEvent<'_, Res, E>) {}
}

impl<F, Res, E> OnRetry<Res, E> for F
where
    F: Fn(&RetryEvent<'_, Res, E>),
{
    fn on_retry(&self, event: &RetryEvent<'_, Res, E>) {
        self(event)
    }
}
