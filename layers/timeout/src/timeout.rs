use crate::cap::Cap;
use crate::error::{Elapsed, TimeoutError};
use crate::Deadline;
use pin_project_lite::pin_project;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::{Instant, Sleep};
use tower_layer::Layer;
use tower_once_core::carrier::Carrier;
use tower_service::Service;

/// Caps each call of the inner service at a wall-clock limit, or at the remaining
/// [`Deadline`] when that is sooner. See the [crate docs](crate).
///
/// ```
/// use std::time::Duration;
/// use tower::{ServiceBuilder, ServiceExt};
/// use tower_once_timeout::TimeoutLayer;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let svc = ServiceBuilder::new()
///     .layer(TimeoutLayer::new(Duration::from_millis(200)))
///     .service_fn(|prompt: String| async move {
///         tokio::time::sleep(Duration::from_secs(5)).await; // a slow LLM call
///         Ok::<_, std::convert::Infallible>(prompt)
///     });
/// let err = svc.oneshot("hello".to_owned()).await.unwrap_err();
/// assert!(err.is_elapsed());
/// # }
/// ```
#[derive(Debug, Clone, Copy)]
pub struct TimeoutLayer {
    limit: Duration,
}

impl TimeoutLayer {
    /// A layer that caps every call at `limit`.
    pub const fn new(limit: Duration) -> Self {
        Self { limit }
    }
}

impl<S> Layer<S> for TimeoutLayer {
    type Service = Timeout<S>;

    fn layer(&self, inner: S) -> Timeout<S> {
        Timeout::new(inner, self.limit)
    }
}

/// Middleware that caps each call at a limit or the remaining deadline; built by
/// [`TimeoutLayer`].
#[derive(Debug, Clone)]
pub struct Timeout<S> {
    inner: S,
    limit: Duration,
}

impl<S> Timeout<S> {
    /// Wraps `inner`, capping every call at `limit`.
    pub const fn new(inner: S, limit: Duration) -> Self {
        Self { inner, limit }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, consuming this one.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, Req> Service<Req> for Timeout<S>
where
    S: Service<Req>,
    Req: Carrier,
{
    type Response = S::Response;
    type Error = TimeoutError<S::Error>;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(TimeoutError::inner)
    }

    // NOTE: inlined into the caller (a boxing or mapping layer above), it writes the future
    // where the caller keeps it, without a call frame of its own.
    #[inline]
    fn call(&mut self, mut req: Req) -> Self::Future {
        let cap = Cap::new(self.limit, Deadline::of(&req));
        if cap.is_spent() {
            return ResponseFuture::spent(cap);
        }
        // Inner layers and transports see this call's own, tighter, deadline: in scope, and
        // on the request when it carries one (across a `Buffer` or a task).
        let deadline = Deadline::at(cap.until);
        deadline.attach(&mut req);
        let inner = deadline.scope(|| self.inner.call(req));
        ResponseFuture::new(inner, cap)
    }
}

pin_project! {
    /// Response future of [`Timeout`].
    pub struct ResponseFuture<F> {
        // `None` when the deadline was spent before the call: the inner service was not called.
        // NOTE: a flat struct, not an enum of states: the happy path builds it in place, with no
        // copy of the (large) timer between states.
        #[pin]
        inner: Option<F>,
        // The timer, made by the first poll that finds the inner future pending (or the
        // deadline in scope earlier than `until`): a call that answers at once never makes one,
        // so it neither looks up the runtime's handle nor clones (and drops) its `Arc`.
        #[pin]
        sleep: Option<Sleep>,
        // When the call times out: the timer's deadline once there is a timer.
        until: Instant,
        elapsed: Elapsed,
    }
}

impl<F> ResponseFuture<F> {
    #[inline]
    pub(crate) fn new(inner: F, cap: Cap) -> Self {
        Self {
            inner: Some(inner),
            sleep: None,
            until: cap.until,
            elapsed: cap.elapsed,
        }
    }

    #[inline]
    pub(crate) fn spent(cap: Cap) -> Self {
        Self {
            inner: None,
            sleep: None,
            until: cap.until,
            elapsed: cap.elapsed,
        }
    }
}

impl<F, T, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<T, E>>,
{
    type Output = Result<T, TimeoutError<E>>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let Some(inner) = this.inner.as_pin_mut() else {
            return Poll::Ready(Err(timed_out_before_call(*this.elapsed)));
        };
        // The deadline in scope while the caller polls (`Deadline::in_scope`, a retry's
        // attempt polling this future across a `Buffer`) caps the call too. NOTE: checked
        // before the inner future is polled: one that passed already (a `Buffer` whose worker
        // called this layer late, outside the caller's scope) lets the inner future never run.
        if let Some(current) = Deadline::current() {
            if current.instant() < *this.until {
                if let Poll::Ready(e) =
                    tighten(this.sleep.as_mut(), this.until, this.elapsed, current, cx)
                {
                    return Poll::Ready(Err(e.into()));
                }
            }
        }
        // NOTE: otherwise the inner future is polled first, so a result that is ready in the
        // same poll as the timer wins (as in tower::timeout).
        if let Poll::Ready(result) = inner.poll(cx) {
            return Poll::Ready(result.map_err(TimeoutError::inner));
        }
        match arm(this.sleep, *this.until).poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(timed_out(*this.elapsed).into())),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// The timer, made now if this is the first poll that needs it.
#[inline]
fn arm(mut sleep: Pin<&mut Option<Sleep>>, until: Instant) -> Pin<&mut Sleep> {
    if sleep.is_none() {
        sleep.set(Some(tokio::time::sleep_until(until)));
    }
    match sleep.as_pin_mut() {
        Some(sleep) => sleep,
        None => unreachable!("the timer was just made"),
    }
}

/// The deadline in scope is earlier than the call's own: it becomes the call's bound (and the
/// timer's), and the call times out at once if it has passed.
#[cold]
#[inline(never)]
fn tighten(
    mut sleep: Pin<&mut Option<Sleep>>,
    until: &mut Instant,
    elapsed: &mut Elapsed,
    current: Deadline,
    cx: &mut Context<'_>,
) -> Poll<Elapsed> {
    *until = current.instant();
    *elapsed = Elapsed::new(current.remaining(), true);
    match sleep.as_mut().as_pin_mut() {
        Some(sleep) => sleep.reset(current.instant()),
        None => sleep.set(Some(tokio::time::sleep_until(current.instant()))),
    }
    if arm(sleep, *until).poll(cx).is_ready() {
        elapsed.record("timeout");
        tracing::debug!("deadline in scope already passed; inner future not polled");
        return Poll::Ready(*elapsed);
    }
    Poll::Pending
}

#[cold]
#[inline(never)]
fn timed_out_before_call<E>(elapsed: Elapsed) -> TimeoutError<E> {
    elapsed.record("timeout");
    tracing::debug!("deadline already spent; inner service not called");
    elapsed.into()
}

#[cold]
#[inline(never)]
fn timed_out(elapsed: Elapsed) -> Elapsed {
    elapsed.record("timeout");
    tracing::debug!(limit = ?elapsed.limit(), deadline = elapsed.is_deadline(), "call timed out");
    elapsed
}
