//! Classifying gRPC calls whose status comes in trailers.
//!
//! A gRPC server answers a failed unary call either trailers-only (`grpc-status` in the response
//! headers, which [`HttpClassifier`](crate::classify::HttpClassifier) reads directly) or with
//! headers first and the status in trailers after the body. A classifier only sees the response
//! head, so for the second form place [`GrpcTrailersLayer`] below the retry layer: it reads such
//! a response's body (up to a limit), hands the trailers up as the [`Trailers`] response
//! extension, and returns the same bytes and trailers. `HttpClassifier` consults it.
//!
//! ```
//! use std::time::Duration;
//! use tower::ServiceBuilder;
//! use tower_once_retry::{classify::HttpClassifier, grpc::GrpcTrailersLayer, RetryLayer};
//!
//! let stack = ServiceBuilder::new()
//!     .layer(RetryLayer::new().classify(HttpClassifier).into_http())
//!     .layer(GrpcTrailersLayer::new(64 * 1024));
//! # let _ = stack;
//! ```
//!
//! Only gRPC responses (`content-type: application/grpc...`) without `grpc-status` in their
//! headers are read; everything else streams through untouched. A body over the limit streams
//! through too, unclassified by its trailers. Use it for unary calls: a streaming call's
//! response is read in full before the caller sees it.

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use pin_project_lite::pin_project;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use tower_layer::Layer;
use tower_once_core::body::{BufferedBody, Collected, Collector};
use tower_once_core::grpc::is_grpc;
use tower_service::Service;

/// The trailers of a gRPC response read by [`GrpcTrailersLayer`], as a response extension.
pub use tower_once_core::grpc::Trailers;

/// Reads the trailers of gRPC responses so their status can be classified. See the
/// [module docs](self).
#[derive(Debug, Clone, Copy)]
pub struct GrpcTrailersLayer {
    limit: usize,
}

impl GrpcTrailersLayer {
    /// Reads bodies of up to `limit` bytes.
    pub const fn new(limit: usize) -> Self {
        Self { limit }
    }
}

impl<S> Layer<S> for GrpcTrailersLayer {
    type Service = GrpcTrailers<S>;

    fn layer(&self, inner: S) -> Self::Service {
        GrpcTrailers {
            inner,
            limit: self.limit,
        }
    }
}

/// Middleware built by [`GrpcTrailersLayer`].
#[derive(Debug, Clone)]
pub struct GrpcTrailers<S> {
    inner: S,
    limit: usize,
}

impl<S> GrpcTrailers<S> {
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

impl<S, B, ResB> Service<Request<B>> for GrpcTrailers<S>
where
    S: Service<Request<B>, Response = Response<ResB>>,
    ResB: Body<Data = Bytes>,
{
    type Response = Response<BufferedBody<ResB>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, ResB>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        ResponseFuture {
            state: State::Waiting {
                future: self.inner.call(req),
            },
            limit: self.limit,
        }
    }
}

pin_project! {
    /// Response future of [`GrpcTrailers`].
    pub struct ResponseFuture<F, B: Body> {
        #[pin]
        state: State<F, B>,
        limit: usize,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, B: Body> {
        Waiting { #[pin] future: F },
        Reading {
            parts: Option<http::response::Parts>,
            body: Option<Pin<Box<B>>>,
            collected: Collector,
        },
    }
}

impl<F, B, E> Future for ResponseFuture<F, B>
where
    F: Future<Output = Result<Response<B>, E>>,
    B: Body<Data = Bytes>,
{
    type Output = Result<Response<BufferedBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Waiting { future } => {
                    let response = ready!(future.poll(cx))?;
                    let headers = response.headers();
                    if !is_grpc(headers) || headers.contains_key("grpc-status") {
                        return Poll::Ready(Ok(response.map(BufferedBody::streaming)));
                    }
                    let (parts, body) = response.into_parts();
                    this.state.set(State::Reading {
                        parts: Some(parts),
                        body: Some(Box::pin(body)),
                        collected: Collector::default(),
                    });
                }
                StateProj::Reading {
                    parts,
                    body,
                    collected,
                } => {
                    let Some(stream) = body.as_mut() else {
                        panic!("ResponseFuture polled after completion");
                    };
                    let mut trailers = None;
                    let outcome = ready!(collected.poll_collect(
                        stream.as_mut(),
                        *this.limit,
                        &mut trailers,
                        cx
                    ));
                    let (Some(mut parts), Some(rest)) = (parts.take(), body.take()) else {
                        panic!("ResponseFuture polled after completion");
                    };
                    let collected = std::mem::take(collected);
                    let body = match outcome {
                        Collected::Complete => {
                            if let Some(trailers) = &trailers {
                                parts.extensions.insert(Trailers(trailers.clone()));
                            }
                            BufferedBody::full_with_trailers(collected.finish(), trailers)
                        }
                        Collected::Over(data) => {
                            BufferedBody::prefixed(collected.finish_with(data), rest)
                        }
                        Collected::Failed(error) => BufferedBody::failed(collected.finish(), error),
                    };
                    return Poll::Ready(Ok(Response::from_parts(parts, body)));
                }
            }
        }
    }
}
