//! The server side: [`ServerTimeoutLayer`], its service and its future.

use super::body::TimeoutBody;
use crate::cap::Cap;
use crate::grpc;
use crate::Deadline;
use http::{Request, Response, StatusCode};
use pin_project_lite::pin_project;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::{Instant, Sleep};
use tower_layer::Layer;
use tower_once_core::grpc::Code;
use tower_service::Service;

/// The server-side timeout: a handler that runs past the limit is dropped and the client gets
/// a status (default `503 Service Unavailable`) instead of an error, so the layer can sit on an
/// axum router. gRPC requests (`content-type: application/grpc...`) get gRPC's own answer,
/// `grpc-status: 4` (`DEADLINE_EXCEEDED`) in a trailers-only response.
///
/// The handler sees its deadline as a [`Deadline`] request extension, so its own outgoing calls
/// can carry the time left on.
///
/// ```no_run
/// use std::time::Duration;
/// use axum::{routing::get, Router};
/// use tower_once_timeout::http::ServerTimeoutLayer;
///
/// let app: Router = Router::new()
///     .route("/", get(|| async { "hi" }))
///     .layer(
///         ServerTimeoutLayer::new(Duration::from_secs(10))
///             .status(http::StatusCode::GATEWAY_TIMEOUT)
///             .honor_grpc_timeout(true),
///     );
/// ```
#[derive(Debug, Clone)]
pub struct ServerTimeoutLayer {
    limit: Duration,
    status: StatusCode,
    grpc_timeout: bool,
    cover_body: bool,
}

impl ServerTimeoutLayer {
    /// Drops handlers that run longer than `limit`, answering `503`.
    pub const fn new(limit: Duration) -> Self {
        Self {
            limit,
            status: StatusCode::SERVICE_UNAVAILABLE,
            grpc_timeout: false,
            cover_body: false,
        }
    }

    /// The status answered on expiry (for example `504` or `408`). Default `503`.
    pub const fn status(mut self, status: StatusCode) -> Self {
        self.status = status;
        self
    }

    /// Whether a `grpc-timeout` sent by the client also caps the handler (the smaller bound
    /// wins). Default `false`: only trust it from clients you trust.
    pub const fn honor_grpc_timeout(mut self, honor: bool) -> Self {
        self.grpc_timeout = honor;
        self
    }

    /// Whether the limit also covers streaming the response body; past it the body ends with
    /// an error (the connection is cut, as headers are already sent). Default `false`.
    pub const fn cover_body(mut self, cover: bool) -> Self {
        self.cover_body = cover;
        self
    }
}

impl<S> Layer<S> for ServerTimeoutLayer {
    type Service = ServerTimeout<S>;

    fn layer(&self, inner: S) -> ServerTimeout<S> {
        ServerTimeout {
            inner,
            config: self.clone(),
        }
    }
}

/// Middleware built by [`ServerTimeoutLayer`].
#[derive(Debug, Clone)]
pub struct ServerTimeout<S> {
    inner: S,
    config: ServerTimeoutLayer,
}

impl<S> ServerTimeout<S> {
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

impl<S, B, ResB> Service<Request<B>> for ServerTimeout<S>
where
    S: Service<Request<B>, Response = Response<ResB>>,
{
    type Response = Response<TimeoutBody<ResB>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        let incoming = self
            .config
            .grpc_timeout
            .then(|| req.headers().get(grpc::GRPC_TIMEOUT))
            .flatten()
            .and_then(|v| grpc::decode(v.as_bytes()))
            .map(Deadline::after);
        let cap = Cap::new(
            self.config.limit,
            Deadline::earliest(Deadline::of(&req), incoming),
        );
        let is_grpc = tower_once_core::grpc::is_grpc(req.headers());
        let expired = expired_response(self.config.status, is_grpc);
        if cap.is_spent() {
            return ResponseFuture {
                kind: Kind::Expired {
                    response: Some(expired),
                },
            };
        }
        let deadline = Deadline::at(cap.until);
        req.extensions_mut().insert(deadline);
        let inner = deadline.scope(|| self.inner.call(req));
        ResponseFuture {
            kind: Kind::Running {
                inner,
                sleep: tokio::time::sleep_until(cap.until),
                expired: Some(expired),
                elapsed: cap.elapsed,
                cover: self.config.cover_body.then_some((cap.until, cap.elapsed)),
            },
        }
    }
}

/// The answer on expiry; built before the call so no allocation happens under time pressure.
fn expired_response(status: StatusCode, grpc: bool) -> Response<()> {
    if grpc {
        return Code::DeadlineExceeded.trailers_only("Deadline%20Exceeded");
    }
    let mut response = Response::new(());
    *response.status_mut() = status;
    response
}

pin_project! {
    /// Response future of [`ServerTimeout`].
    pub struct ResponseFuture<F> {
        #[pin]
        kind: Kind<F>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<F> {
        Running {
            #[pin] inner: F,
            #[pin] sleep: Sleep,
            expired: Option<Response<()>>,
            elapsed: crate::Elapsed,
            cover: Option<(Instant, crate::Elapsed)>,
        },
        Expired { response: Option<Response<()>> },
    }
}

impl<F, ResB, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<Response<ResB>, E>>,
{
    type Output = Result<Response<TimeoutBody<ResB>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let expired = match self.project().kind.project() {
            KindProj::Running {
                inner,
                sleep,
                expired,
                elapsed,
                cover,
            } => {
                // NOTE: a handler that is ready wins over a timer that fired in the same poll.
                if let Poll::Ready(result) = inner.poll(cx) {
                    let cover = cover.take();
                    return Poll::Ready(result.map(|r| r.map(|b| TimeoutBody::new(b, cover))));
                }
                if sleep.poll(cx).is_pending() {
                    return Poll::Pending;
                }
                elapsed.record("server");
                tracing::debug!("handler timed out; answering without it");
                expired.take()
            }
            KindProj::Expired { response } => response.take(),
        };
        match expired {
            Some(response) => Poll::Ready(Ok(response.map(|()| TimeoutBody::empty()))),
            None => tower_once_core::polled_after_completion("ResponseFuture"),
        }
    }
}
