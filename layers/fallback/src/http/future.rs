//! The response future: reading the body, then the primary and, when the rule allows it, the
//! secondary, each with the same request.

use super::service::{Markable, Secondary};
use crate::config::Config;
use crate::error::FallbackError;
use crate::future::Held;
use crate::hook::OnFallback;
use crate::rule::Facts;
use bytes::Bytes;
use http::request::Parts;
use http::{Request, Response};
use http_body::Body;
use pin_project_lite::pin_project;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use tokio::time::Sleep;
use tower_once_core::attempt::CopyWatch;
use tower_once_core::body::{BufferedBody, Collected, Collector};
use tower_once_core::classify::Classify;
use tower_once_core::shard::Padded;
use tower_once_core::unsent::Unsent;
use tower_once_timeout::Deadline;
use tower_service::Service;

/// What the operation needs once the request body is read.
pub(super) struct Pending<P, T, C, H> {
    pub(super) primary: P,
    pub(super) parts: Parts,
    pub(super) facts: Facts,
    pub(super) deadline: Option<Deadline>,
    pub(super) config: Arc<Padded<Config<Secondary<T>, C, H>>>,
    pub(super) limit: usize,
}

type Req<B> = Request<BufferedBody<B>>;
type Core<P, T, B, C, H> =
    crate::ResponseFuture<<P as Service<Req<B>>>::Future, Secondary<T>, Req<B>, C, H>;

pin_project! {
    /// Response future of [`HttpFallback`](super::HttpFallback).
    pub struct ResponseFuture<P, T, B, C, H>
    where
        P: Service<Req<B>>,
        T: Service<Req<B>>,
        T::Response: Markable,
        B: Body,
    {
        #[pin]
        state: HttpState<P::Future, Core<P, T, B, C, H>, B>,
        // The deadline while the body is read.
        #[pin]
        cutoff: Option<Sleep>,
        pending: Option<Pending<P, T, C, H>>,
    }
}

pin_project! {
    #[project = HttpStateProj]
    enum HttpState<PF, CF, B> {
        Reading { body: Option<Pin<Box<B>>>, collected: Collector },
        Running { #[pin] core: CF },
        // The primary only: the body could not be read for a copy.
        Once { #[pin] future: PF },
    }
}

impl<P, T, B, C, H> ResponseFuture<P, T, B, C, H>
where
    P: Service<Req<B>>,
    T: Service<Req<B>>,
    T::Response: Markable,
    B: Body,
{
    pub(super) fn new(body: B, pending: Pending<P, T, C, H>) -> Self {
        Self {
            state: HttpState::Reading {
                body: Some(Box::pin(body)),
                collected: Collector::default(),
            },
            cutoff: None,
            pending: Some(pending),
        }
    }
}

/// The request again, for the secondary: the same parts and bytes.
fn copy_of<B: Body>(parts: &Parts, bytes: Bytes) -> Req<B> {
    let mut req = Request::new(BufferedBody::full(bytes));
    *req.method_mut() = parts.method.clone();
    *req.uri_mut() = parts.uri.clone();
    *req.version_mut() = parts.version;
    *req.headers_mut() = parts.headers.clone();
    *req.extensions_mut() = parts.extensions.clone();
    req
}

/// Calls the primary, inside the deadline's scope.
fn call<P, B>(primary: &mut P, req: Req<B>, deadline: Option<Deadline>) -> P::Future
where
    P: Service<Req<B>>,
    B: Body,
{
    match deadline {
        Some(deadline) => deadline.scope(|| primary.call(req)),
        None => primary.call(req),
    }
}

impl<P, T, B, ResB, C, H> Future for ResponseFuture<P, T, B, C, H>
where
    P: Service<Req<B>, Response = Response<ResB>>,
    P::Error: Unsent,
    T: Service<Req<B>, Response = Response<ResB>> + Clone,
    B: Body<Data = Bytes>,
    C: Classify<Response<ResB>, P::Error>,
    H: OnFallback<Response<ResB>, P::Error>,
{
    type Output = Result<Response<ResB>, FallbackError<P::Error, T::Error>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                HttpStateProj::Running { core } => return core.poll(cx),
                HttpStateProj::Once { future } => {
                    return future.poll(cx).map_err(FallbackError::primary)
                }
                HttpStateProj::Reading { body, collected } => {
                    let (Some(stream), Some(pending)) = (body.as_mut(), this.pending.as_ref())
                    else {
                        tower_once_core::polled_after_completion("HttpFallback's ResponseFuture");
                    };
                    // Request trailers are not kept.
                    let mut trailers = None;
                    let Poll::Ready(outcome) =
                        collected.poll_collect(stream.as_mut(), pending.limit, &mut trailers, cx)
                    else {
                        // A body that stalls is still inside the deadline.
                        let Some(deadline) = pending.deadline else {
                            return Poll::Pending;
                        };
                        if this.cutoff.is_none() {
                            this.cutoff
                                .set(Some(tokio::time::sleep_until(deadline.instant())));
                        }
                        if let Some(cutoff) = this.cutoff.as_mut().as_pin_mut() {
                            ready!(cutoff.poll(cx));
                        }
                        *this.pending = None;
                        body.take();
                        return Poll::Ready(Err(FallbackError::deadline()));
                    };
                    let Some(Pending {
                        mut primary,
                        parts,
                        facts,
                        deadline,
                        config,
                        ..
                    }) = this.pending.take()
                    else {
                        tower_once_core::polled_after_completion("HttpFallback's ResponseFuture");
                    };
                    let collected = std::mem::take(collected);
                    match (outcome, body.take()) {
                        (Collected::Complete, _) => {
                            let bytes = collected.finish();
                            let held = Held {
                                request: copy_of(&parts, bytes.clone()),
                                facts,
                            };
                            let mut req = Request::from_parts(parts, BufferedBody::full(bytes));
                            let watch = CopyWatch::attach(&mut req);
                            let future = call(&mut primary, req, deadline);
                            this.state.set(HttpState::Running {
                                core: crate::ResponseFuture::new(
                                    future, held, watch, deadline, config,
                                ),
                            });
                        }
                        (Collected::Over(data), Some(rest)) => {
                            tracing::debug!("request body over the limit: the primary only");
                            let body = BufferedBody::prefixed(collected.finish_with(data), rest);
                            let future =
                                call(&mut primary, Request::from_parts(parts, body), deadline);
                            this.state.set(HttpState::Once { future });
                        }
                        (Collected::Failed(error), _) => {
                            // NOTE: never a truncated body passed off as complete: the primary
                            // sees the bytes read so far, then the error.
                            let body = BufferedBody::failed(collected.finish(), error);
                            let future =
                                call(&mut primary, Request::from_parts(parts, body), deadline);
                            this.state.set(HttpState::Once { future });
                        }
                        (Collected::Over(_), None) => tower_once_core::polled_after_completion(
                            "HttpFallback's ResponseFuture",
                        ),
                    }
                }
            }
        }
    }
}
