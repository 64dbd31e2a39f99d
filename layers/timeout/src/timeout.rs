use crate::cap::Cap;
use crate::error::{Elapsed, TimeoutError};
use crate::Deadline;
use pin_project_lite::pin_project;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::Sleep;
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
        #[pin]
        sleep: Sleep,
        elapsed: Elapsed,
    }
}

impl<F> ResponseFuture<F> {
    #[inline]
    pub(crate) fn new(inner: F, cap: Cap) -> Self {
        Self {
            inner: Some(inner),
            sleep: tokio::time::sleep_until(cap.until),
            elapsed: cap.elapsed,
        }
    }

    pub(crate) fn spent(cap: Cap) -> Self {
        Self {
            inner: None,
            sleep: tokio::time::sleep_until(cap.until),
            elapsed: cap.elapsed,
        }
    }
}

impl<F, T, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<T, E>>,
{
    type Output = Result<T, TimeoutError<E>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let Some(inner) = this.inner.as_pin_mut() else {
            this.elapsed.record("timeout");
            tracing::debug!("deadline already spent; inner service not called");
            return Poll::Ready(Err((*this.elapsed).into()));
        };
        // The deadline in scope while the caller polls (`Deadline::in_scope`, a retry's
        // attempt polling this future across a `Buffer`) caps the call too. NOTE: checked
        // before the inner future is polled: one that passed already (a `Buffer` whose worker
        // called this layer late, outside the caller's scope) lets the inner future never run.
        if let Some(current) = Deadline::current() {
            if current.instant() < this.sleep.deadline() {
                *this.elapsed = Elapsed::new(current.remaining(), true);
                this.sleep.as_mut().reset(current.instant());
                if this.sleep.as_mut().poll(cx).is_ready() {
                    this.elapsed.record("timeout");
                    tracing::debug!("deadline in scope already passed; inner future not polled");
                    return Poll::Ready(Err((*this.elapsed).into()));
                }
            }
        }
        // NOTE: otherwise the inner future is polled first, so a result that is ready in the
        // same poll as the timer wins (as in tower::timeout).
        if let Poll::Ready(result) = inner.poll(cx) {
            return Poll::Ready(result.map_err(TimeoutError::inner));
        }
        match this.sleep.poll(cx) {
            Poll::Ready(()) => {
                this.elapsed.record("timeout");
                tracing::debug!(limit = ?this.elapsed.limit(), deadline = this.elapsed.is_deadline(), "call timed out");
                Poll::Ready(Err((*this.elapsed).into()))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}
