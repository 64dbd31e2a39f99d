//! The response future: reading the body, then the primary and, when the rule allows it, the
//! secondary, each with the same request.

use super::secondary::{Markable, Secondary};
use crate::config::Config;
use crate::error::FallbackError;
use crate::future::Held;
use crate::hook::OnFallback;
use crate::rule::Facts;
use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use pin_project_lite::pin_project;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use tower_once_core::attempt::CopyWatch;
use tower_once_core::body::BufferedBody;
use tower_once_core::classify::Classify;
use tower_once_core::replay::{Read, ReadForReplay};
use tower_once_core::shard::Padded;
use tower_once_core::unsent::Unsent;
use tower_once_timeout::Deadline;
use tower_service::Service;

/// What the operation needs once the request body is read.
pub(super) struct Pending<P, T, C, H> {
    pub(super) primary: P,
    pub(super) facts: Facts,
    pub(super) deadline: Option<Deadline>,
    pub(super) config: Arc<Padded<Config<Secondary<T>, C, H>>>,
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
        state: HttpState<P::Future, Core<P, T, B, C, H>, ReadForReplay<B>>,
        pending: Option<Pending<P, T, C, H>>,
    }
}

pin_project! {
    #[project = HttpStateProj]
    enum HttpState<PF, CF, Rd> {
        // The body, read for the secondary, within the deadline.
        Reading { #[pin] read: Rd },
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
    pub(super) fn new(read: ReadForReplay<B>, pending: Pending<P, T, C, H>) -> Self {
        Self {
            state: HttpState::Reading { read },
            pending: Some(pending),
        }
    }
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
                HttpStateProj::Reading { read } => {
                    let read = ready!(read.poll(cx));
                    let Some(Pending {
                        mut primary,
                        facts,
                        deadline,
                        config,
                    }) = this.pending.take()
                    else {
                        tower_once_core::polled_after_completion("HttpFallback's ResponseFuture");
                    };
                    match read {
                        Read::Whole(replay) => {
                            let held = Held {
                                request: replay.copy(),
                                facts,
                            };
                            let mut req = replay.into_request();
                            let watch = CopyWatch::attach(&mut req);
                            let future = call(&mut primary, req, deadline);
                            this.state.set(HttpState::Running {
                                core: crate::ResponseFuture::new(
                                    future, held, watch, deadline, config,
                                ),
                            });
                        }
                        // NOTE: a body that passed the limit or failed just as the deadline
                        // came goes nowhere: nothing is sent at the deadline.
                        Read::Once(_) if deadline.is_some_and(Deadline::is_expired) => {
                            return Poll::Ready(Err(FallbackError::deadline()))
                        }
                        Read::Once(req) => {
                            tracing::debug!("request body not read whole: the primary only");
                            let future = call(&mut primary, req, deadline);
                            this.state.set(HttpState::Once { future });
                        }
                        Read::Elapsed(_) => return Poll::Ready(Err(FallbackError::deadline())),
                    }
                }
            }
        }
    }
}
