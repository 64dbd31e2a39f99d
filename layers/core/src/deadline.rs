//! One monotonic deadline for a whole operation, and how it reaches inner layers.

use crate::carrier::Carrier;
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
/// - **with the request**, in its extensions, for every request type that is a
///   [`Carrier`] (`http::Request`, `tonic::Request`, the worker's `Job`, the outbox's
///   `OutboxMessage`): it crosses a `tower::buffer::Buffer`, a spawned task or a channel with
///   the request ([`attach`](Self::attach), [`of`](Self::of));
/// - **in scope** on the thread, for any request type: code polled inside
///   [`Deadline::in_scope`] sees it through [`Deadline::current`]. The layers read the scope
///   when they are called *and every time their futures are polled*, so a deadline in scope
///   while the caller polls also reaches layers behind a `Buffer` (whose worker hands the inner
///   future back to the caller).
///
/// [`Deadline::call`] does both: the way a caller gives a call its deadline.
///
/// `RetryLayer` sets both on each attempt; `TimeoutLayer` and `HttpTimeoutLayer` read both and
/// always keep the earliest.
///
/// | the caller gives the deadline | inner layers in the same task | behind a `Buffer` | on another task |
/// |---|---|---|---|
/// | on the request ([`attach`](Self::attach)), a [`Carrier`] | ✓ | ✓ | ✓ |
/// | [`in_scope`](Self::in_scope) around the call's future | ✓ | ✓ (the worker calls the layers behind it outside the scope, so an inner service may be *called* late; its future is never polled past the deadline) | – |
/// | [`call`](Self::call): both of the above | ✓ | ✓ | ✓ for a [`Carrier`] |
///
/// ```
/// use std::time::Duration;
/// use tower_once_core::deadline::Deadline;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let deadline = Deadline::after(Duration::from_secs(2));
/// assert_eq!(deadline.remaining(), Duration::from_secs(2));
/// assert_eq!(Deadline::current(), None);
/// let seen = deadline.in_scope(async { Deadline::current() }).await;
/// assert_eq!(seen, Some(deadline));
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
    /// The deadline `within` from now.
    pub fn after(within: Duration) -> Self {
        // Saturates (about 100 years) instead of panicking on `Duration::MAX`.
        Self(crate::time::saturating_add(Instant::now(), within))
    }

    /// The deadline at `instant`.
    #[inline]
    pub const fn at(instant: Instant) -> Self {
        Self(instant)
    }

    /// The instant.
    #[inline]
    pub const fn instant(self) -> Instant {
        self.0
    }

    /// Time left, zero once passed.
    #[inline]
    pub fn remaining(self) -> Duration {
        self.0.saturating_duration_since(Instant::now())
    }

    /// Whether the deadline has passed.
    #[inline]
    pub fn is_expired(self) -> bool {
        self.0 <= Instant::now()
    }

    /// The deadline of the innermost enclosing [`scope`](Self::scope) on this thread, if any.
    #[inline]
    pub fn current() -> Option<Self> {
        CURRENT.with(Cell::get)
    }

    /// The earlier of two optional deadlines: the one rule every layer applies when two
    /// deadlines meet (deadlines only tighten).
    #[inline]
    pub fn earliest(a: Option<Self>, b: Option<Self>) -> Option<Self> {
        match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// This deadline, or `other` when it is earlier.
    #[inline]
    pub fn tightened(self, other: Option<Self>) -> Self {
        match other {
            Some(other) if other < self => other,
            _ => self,
        }
    }

    /// The earlier of the deadline the request carries and the current scope.
    pub fn of<R: Carrier + ?Sized>(request: &R) -> Option<Self> {
        Self::earliest(Self::carried(request), Self::current())
    }

    /// The deadline the request carries, if it is a [`Carrier`] with one.
    pub fn carried<R: Carrier + ?Sized>(request: &R) -> Option<Self> {
        request
            .extensions()
            .and_then(|e| e.get::<Deadline>())
            .copied()
    }

    /// Puts this deadline on `request`, to travel with it: across a `Buffer`, a spawned task
    /// or a channel. Deadlines only tighten: a request that carries an earlier one keeps it.
    /// A request type that carries nothing ([`Carrier`]) is left as it is.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_once_core::deadline::Deadline;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let mut req = http::Request::new(());
    /// let soon = Deadline::after(Duration::from_secs(1));
    /// soon.attach(&mut req);
    /// Deadline::after(Duration::from_secs(60)).attach(&mut req);
    /// assert_eq!(Deadline::carried(&req), Some(soon));
    /// # }
    /// ```
    pub fn attach<R: Carrier + ?Sized>(self, request: &mut R) {
        if let Some(extensions) = request.extensions_mut() {
            let carried = extensions.get::<Deadline>().copied();
            extensions.insert(carried.map_or(self, |carried| carried.min(self)));
        }
    }

    /// Calls `service` with `request` under this deadline, the way a caller gives an operation
    /// its deadline: the request carries it (when it is a [`Carrier`]), the call runs in its
    /// scope, and so does every poll of the returned future. So it reaches every layer below,
    /// behind a `tower::buffer::Buffer` too (whose `call` only queues the request, and whose
    /// layers run while the caller polls).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_once_core::deadline::Deadline;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let mut svc = tower::service_fn(|req: http::Request<()>| async move {
    ///     // What a layer below sees: the deadline the request carries, and the one in scope.
    ///     Ok::<_, std::convert::Infallible>((Deadline::carried(&req), Deadline::current()))
    /// });
    /// let deadline = Deadline::after(Duration::from_secs(1));
    /// let seen = deadline.call(&mut svc, http::Request::new(())).await.unwrap();
    /// assert_eq!(seen, (Some(deadline), Some(deadline)));
    /// # }
    /// ```
    pub fn call<S, R>(self, service: &mut S, mut request: R) -> InScope<S::Future>
    where
        S: tower_service::Service<R>,
        R: Carrier,
    {
        self.attach(&mut request);
        self.in_scope(self.scope(|| service.call(request)))
    }

    /// Runs `f` with this deadline as the [`current`](Self::current) one. Scopes only tighten:
    /// inside an enclosing scope with an earlier deadline, that one stays current.
    ///
    /// The layers' own plumbing: a future `f` returns is *not* polled in the scope, so a caller
    /// gives a deadline with [`call`](Self::call) (or [`attach`](Self::attach) and
    /// [`in_scope`](Self::in_scope)), never with this around `call` alone.
    #[doc(hidden)]
    pub fn scope<R>(self, f: impl FnOnce() -> R) -> R {
        let tightened = Self::earliest(Self::current(), Some(self));
        crate::scope::with(&CURRENT, tightened, f).0
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
