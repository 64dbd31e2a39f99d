//! tonic clients: put the retry and timeout layers on a `tonic::transport::Channel`
//! (feature `tonic`).
//!
//! Two adapters, one at each end of the stack:
//!
//! - [`TonicBodyLayer`], right above the `Channel`: the HTTP retry layer sends
//!   [`BufferedBody`](tower_once_core::body::BufferedBody)s and the timeout layer passes them on, while a
//!   `Channel` takes `tonic::body::Body`.
//! - [`GrpcStatusLayer`], on top: turns the stack's typed errors into a `tonic::Status`, so a
//!   call cut by the per-attempt timeout or the operation's deadline reaches the caller as
//!   `DEADLINE_EXCEEDED` (tonic would otherwise report `UNKNOWN` with the error's text), and
//!   any other error as tonic itself would map it.
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use tower::ServiceBuilder;
//! use tower_once_retry::tonic::{GrpcStatusLayer, TonicBodyLayer};
//! use tower_once_retry::RetryLayer;
//! use tower_once_timeout::http::HttpTimeoutLayer;
//!
//! let channel = tonic::transport::Channel::from_static("http://127.0.0.1:50051")
//!     .connect()
//!     .await?;
//! let stack = ServiceBuilder::new()
//!     .layer(GrpcStatusLayer::new())
//!     .layer(RetryLayer::new().deadline(Duration::from_secs(5)).into_http())
//!     .layer(HttpTimeoutLayer::new(Duration::from_secs(1)).propagate_grpc_timeout())
//!     .layer(TonicBodyLayer::new())
//!     .service(channel);
//! // Generated clients take it as they take a Channel:
//! // let mut client = ChargesClient::new(stack);
//! let grpc = tonic::client::Grpc::new(stack);
//! # let _ = grpc;
//! # Ok(())
//! # }
//! ```
//!
//! # Servers
//!
//! tonic's own `transport::Server` enforces an incoming `grpc-timeout` itself and answers
//! `CANCELLED` ("Timeout expired") when it passes. It wraps the services and layers you add, so
//! it fires at the same instant as a `ServerTimeoutLayer` that honours `grpc-timeout`, and
//! usually first. `ServerTimeoutLayer` is for what tonic does not do: a server-side cap of its
//! own (answered `DEADLINE_EXCEEDED`), and gRPC services served by axum or hyper, where nothing
//! else reads `grpc-timeout`.

use crate::RetryError;
use bytes::Bytes;
use http_body::Body;
use pin_project_lite::pin_project;
use std::error::Error as StdError;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use tower_layer::Layer;
use tower_once_timeout::Elapsed;
use tower_service::Service;

type BoxError = Box<dyn StdError + Send + Sync>;

/// Converts request bodies to `tonic::body::Body`, for a stack over a `tonic::transport::Channel`.
#[derive(Debug, Clone, Copy, Default)]
pub struct TonicBodyLayer(());

impl TonicBodyLayer {
    /// The layer.
    pub const fn new() -> Self {
        Self(())
    }
}

impl<S> Layer<S> for TonicBodyLayer {
    type Service = TonicBody<S>;

    fn layer(&self, inner: S) -> Self::Service {
        TonicBody { inner }
    }
}

/// Middleware built by [`TonicBodyLayer`].
#[derive(Debug, Clone)]
pub struct TonicBody<S> {
    inner: S,
}

impl<S> TonicBody<S> {
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

impl<S, B> Service<http::Request<B>> for TonicBody<S>
where
    S: Service<http::Request<tonic::body::Body>>,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> S::Future {
        self.inner.call(req.map(tonic::body::Body::new))
    }
}

/// Turns a retry stack's [`RetryError`] into a `tonic::Status`: see the [module docs](self).
#[derive(Debug, Clone, Copy, Default)]
pub struct GrpcStatusLayer(());

impl GrpcStatusLayer {
    /// The layer.
    pub const fn new() -> Self {
        Self(())
    }
}

impl<S> Layer<S> for GrpcStatusLayer {
    type Service = GrpcStatus<S>;

    fn layer(&self, inner: S) -> Self::Service {
        GrpcStatus { inner }
    }
}

/// Middleware built by [`GrpcStatusLayer`].
#[derive(Debug, Clone)]
pub struct GrpcStatus<S> {
    inner: S,
}

impl<S> GrpcStatus<S> {
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

impl<S, Req, E> Service<Req> for GrpcStatus<S>
where
    S: Service<Req, Error = RetryError<E>>,
    E: Into<BoxError>,
{
    type Response = S::Response;
    type Error = tonic::Status;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), tonic::Status>> {
        self.inner.poll_ready(cx).map_err(to_status)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        ResponseFuture {
            future: self.inner.call(req),
        }
    }
}

pin_project! {
    /// Response future of [`GrpcStatus`].
    #[derive(Debug)]
    pub struct ResponseFuture<F> {
        #[pin]
        future: F,
    }
}

impl<F, T, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<T, RetryError<E>>>,
    E: Into<BoxError>,
{
    type Output = Result<T, tonic::Status>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Poll::Ready(ready!(self.project().future.poll(cx)).map_err(to_status))
    }
}

/// `DEADLINE_EXCEEDED` when time ran out (the operation's deadline, or a timeout below: ours, or
/// the one a `Channel` applies from the `grpc-timeout` it sends) and when the server was still
/// running the operation as the layer gave up (the attempts or the budget ran out): either way
/// the call may still complete, which is what gRPC callers read from `DEADLINE_EXCEEDED`
/// (`UNAVAILABLE` would invite a retry, with a fresh key if the stack stamps one). Otherwise
/// what tonic makes of the last attempt's error. The message says what happened; the
/// idempotency key, when there is one, is in the status's `idempotency-key` metadata.
fn to_status<E: Into<BoxError>>(error: RetryError<E>) -> tonic::Status {
    let key = error
        .idempotency_key()
        .and_then(|k| tonic::metadata::MetadataValue::try_from(k).ok());
    let outline = error.outline().to_string();
    let mut status = match error.into_inner() {
        Err(_) => tonic::Status::deadline_exceeded(outline),
        Ok(inner) => {
            let inner: BoxError = inner.into();
            if timed_out(&*inner) {
                tonic::Status::deadline_exceeded(format!(
                    "{outline}: the last attempt timed out, so the call may still complete: {inner}"
                ))
            } else {
                return tonic::Status::from_error(inner);
            }
        }
    };
    if let Some(key) = key {
        status.metadata_mut().insert("idempotency-key", key);
    }
    status
}

fn timed_out(error: &(dyn StdError + 'static)) -> bool {
    // A `Channel` enforces the `grpc-timeout` it sends, with its own error.
    tower_once_core::chain::any(error, |e| {
        e.is::<Elapsed>() || e.is::<tonic::TimeoutExpired>()
    })
}
