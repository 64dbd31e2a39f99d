//! One monotonic deadline for a whole operation, and how it reaches inner layers.

use pin_project_lite::pin_project;
use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::Instant;

/// The instant by which an operation (all its attempts and the waits between them) must be done.
///
/// It is absolute, on tokio's monotonic clock, so it means the same thing wherever it is read
/// and paused-time tests control it. It reaches inner layers in two ways:
///
/// - as a **request extension** on `http::Request`s, which transports and layers that call
///   their inner service later (or on another task) can read; and
/// - as the **call scope** of [`Deadline::scope`], for any request type: code running inside the
///   closure (typically an inner service's `call`) sees it through [`Deadline::current`].
///
/// `RetryLayer` sets both on each attempt; [`TimeoutLayer`](crate::TimeoutLayer) reads the scope,
/// [`HttpTimeoutLayer`](crate::http::HttpTimeoutLayer) reads both.
///
/// ```
/// use std::time::Duration;
/// use tower_once_timeout::Deadline;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let deadline = Deadline::after(Duration::from_secs(2));
/// assert_eq!(deadline.remaining(), Duration::from_secs(2));
/// assert_eq!(Deadline::current(), None);
/// deadline.scope(|| assert_eq!(Deadline::current(), Some(deadline)));
///
/// let mut req = http::Request::new(());
/// req.extensions_mut().insert(deadline);
/// assert_eq!(Deadline::of(&req), Some(deadline));
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Deadline(Instant);

thread_local! {
    static CURRENT: Cell<Option<Deadline>> = const { Cell::new(None) };
}

impl Deadline {
    /// The deadline `budget` from now.
    pub fn after(budget: Duration) -> Self {
        // Saturates (about 100 years) instead of panicking on `Duration::MAX`.
        Self(tower_once_core::time::saturating_add(
            Instant::now(),
            budget,
        ))
    }

    /// The deadline at `instant`.
    pub const fn at(instant: Instant) -> Self {
        Self(instant)
    }

    /// The instant.
    pub const fn instant(self) -> Instant {
        self.0
    }

    /// Time left, zero once passed.
    pub fn remaining(self) -> Duration {
        self.0.saturating_duration_since(Instant::now())
    }

    /// Whether the deadline has passed.
    pub fn is_expired(self) -> bool {
        self.0 <= Instant::now()
    }

    /// The deadline of the innermost enclosing [`scope`](Self::scope) on this thread, if any.
    pub fn current() -> Option<Self> {
        CURRENT.with(Cell::get)
    }

    /// The earlier of the request's deadline extension and the current scope.
    pub fn of<B>(request: &http::Request<B>) -> Option<Self> {
        earliest(
            request.extensions().get::<Deadline>().copied(),
            Self::current(),
        )
    }

    /// Runs `f` with this deadline as the [`current`](Self::current) one. Scopes only tighten:
    /// inside an enclosing scope with an earlier deadline, that one stays current.
    pub fn scope<R>(self, f: impl FnOnce() -> R) -> R {
        struct Restore(Option<Deadline>);
        impl Drop for Restore {
            fn drop(&mut self) {
                CURRENT.with(|c| c.set(self.0));
            }
        }
        let previous = Self::current();
        let _restore = Restore(previous);
        CURRENT.with(|c| c.set(earliest(previous, Some(self))));
        f()
    }

    /// Polls `future` inside this deadline's [`scope`](Self::scope): not only its first poll
    /// but every poll, so layers that a handler calls from its own `async` body (a job handler
    /// calling a `TimeoutLayer`-wrapped client) see the deadline too. It does not cut the
    /// future: pair it with [`tokio::time::timeout_at`] for that.
    pub fn in_scope<F: Future>(self, future: F) -> InScope<F> {
        InScope {
            deadline: self,
            inner: future,
        }
    }
}

pin_project! {
    /// A future polled inside a [`Deadline`]'s scope: [`Deadline::in_scope`].
    #[derive(Debug)]
    #[must_use = "futures do nothing unless polled"]
    pub struct InScope<F> {
        deadline: Deadline,
        #[pin]
        inner: F,
    }
}

impl<F: Future> Future for InScope<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        this.deadline.scope(|| this.inner.poll(cx))
    }
}

/// The earlier of two optional deadlines.
pub(crate) fn earliest(a: Option<Deadline>, b: Option<Deadline>) -> Option<Deadline> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn scopes_nest_tighten_and_restore() {
        let long = Deadline::after(Duration::from_secs(10));
        let short = Deadline::after(Duration::from_secs(1));
        long.scope(|| {
            short.scope(|| assert_eq!(Deadline::current(), Some(short)));
            assert_eq!(Deadline::current(), Some(long));
            // An inner, later deadline cannot loosen the outer one.
            Deadline::after(Duration::from_secs(60))
                .scope(|| assert_eq!(Deadline::current(), Some(long)));
        });
        assert_eq!(Deadline::current(), None);
        let caught = std::panic::catch_unwind(|| short.scope(|| panic!("boom")));
        assert!(caught.is_err());
        assert_eq!(Deadline::current(), None, "restored after a panic");
    }

    #[tokio::test(start_paused = true)]
    async fn remaining_saturates() {
        let d = Deadline::after(Duration::from_secs(1));
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(d.is_expired());
        assert_eq!(d.remaining(), Duration::ZERO);
    }
}
