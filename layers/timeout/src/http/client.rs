//! The client side: [`HttpTimeoutLayer`], its service and its future.

use super::body::TimeoutBody;
use crate::cap::Cap;
use crate::error::TimeoutError;
use crate::grpc;
use crate::timeout::ResponseFuture as Inner;
use crate::Deadline;
use http::{HeaderName, HeaderValue, Request, Response};
use pin_project_lite::pin_project;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::time::Instant;
use tower_layer::Layer;
use tower_service::Service;

/// The HTTP client-side timeout: [`TimeoutLayer`](crate::TimeoutLayer) plus the deadline
/// extension, an optional cover of the response body, and an optional outgoing header that
/// tells the server the time left.
///
/// ```
/// use std::time::Duration;
/// use tower_once_timeout::http::HttpTimeoutLayer;
///
/// // A tonic channel: cap each call at 2 s (or the remaining deadline), tell the server.
/// let grpc = HttpTimeoutLayer::new(Duration::from_secs(2)).propagate_grpc_timeout();
/// // A hyper client: also cut a response whose body drips in too slowly.
/// let http = HttpTimeoutLayer::new(Duration::from_secs(2))
///     .cover_body(true)
///     .propagate_header(http::HeaderName::from_static("x-request-timeout-ms"));
/// # let _ = (grpc, http);
/// ```
#[derive(Debug, Clone)]
pub struct HttpTimeoutLayer {
    limit: Duration,
    cover_body: bool,
    propagate: Option<Propagate>,
}

#[derive(Debug, Clone)]
enum Propagate {
    Grpc,
    Millis(HeaderName),
}

impl HttpTimeoutLayer {
    /// Caps each call at `limit` (or the remaining deadline).
    pub const fn new(limit: Duration) -> Self {
        Self {
            limit,
            cover_body: false,
            propagate: None,
        }
    }

    /// Whether the limit also covers reading the response body (default `false`: it covers
    /// the time to the response head, as tower's timeout does). When the limit passes mid-body,
    /// the body yields [`TimeoutError`] with [`Elapsed`](crate::Elapsed).
    pub const fn cover_body(mut self, cover: bool) -> Self {
        self.cover_body = cover;
        self
    }

    /// Sends the time left in `grpc-timeout` (gRPC wire format), so the server can stop
    /// working on a call the client has given up on.
    pub fn propagate_grpc_timeout(mut self) -> Self {
        self.propagate = Some(Propagate::Grpc);
        self
    }

    /// Sends the time left, in whole milliseconds (rounded up), in the header `name`.
    pub fn propagate_header(mut self, name: HeaderName) -> Self {
        self.propagate = Some(Propagate::Millis(name));
        self
    }
}

impl<S> Layer<S> for HttpTimeoutLayer {
    type Service = HttpTimeout<S>;

    fn layer(&self, inner: S) -> HttpTimeout<S> {
        HttpTimeout {
            inner,
            config: self.clone(),
        }
    }
}

/// Middleware built by [`HttpTimeoutLayer`].
#[derive(Debug, Clone)]
pub struct HttpTimeout<S> {
    inner: S,
    config: HttpTimeoutLayer,
}

impl<S> HttpTimeout<S> {
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

impl<S, B, ResB> Service<Request<B>> for HttpTimeout<S>
where
    S: Service<Request<B>, Response = Response<ResB>>,
{
    type Response = Response<TimeoutBody<ResB>>;
    type Error = TimeoutError<S::Error>;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(TimeoutError::inner)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        let cap = Cap::new(self.config.limit, Deadline::of(&req));
        if cap.is_spent() {
            return ResponseFuture {
                inner: Inner::spent(cap),
                cover: None,
            };
        }
        let deadline = Deadline::at(cap.until);
        req.extensions_mut().insert(deadline);
        let left = cap.until.saturating_duration_since(Instant::now());
        match &self.config.propagate {
            Some(Propagate::Grpc) => {
                req.headers_mut()
                    .insert(grpc::GRPC_TIMEOUT, grpc::encode(left));
            }
            Some(Propagate::Millis(name)) => {
                let ms =
                    left.as_millis() + u128::from(!left.subsec_nanos().is_multiple_of(1_000_000));
                let ms = u64::try_from(ms).unwrap_or(u64::MAX);
                req.headers_mut()
                    .insert(name.clone(), HeaderValue::from(ms));
            }
            None => {}
        }
        let inner = deadline.scope(|| self.inner.call(req));
        ResponseFuture {
            inner: Inner::new(inner, cap),
            cover: self.config.cover_body.then_some((cap.until, cap.elapsed)),
        }
    }
}

pin_project! {
    /// Response future of [`HttpTimeout`].
    pub struct ResponseFuture<F> {
        #[pin]
        inner: Inner<F>,
        cover: Option<(Instant, crate::Elapsed)>,
    }
}

impl<F, ResB, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<Response<ResB>, E>>,
{
    type Output = Result<Response<TimeoutBody<ResB>>, TimeoutError<E>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let response = ready!(this.inner.poll(cx))?;
        let cover = this.cover.take();
        Poll::Ready(Ok(response.map(|body| TimeoutBody::new(body, cover))))
    }
}
