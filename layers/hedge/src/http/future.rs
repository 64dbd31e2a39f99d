//! The response future: reading the body for copies, then the hedged operation.

use crate::config::Config;
use crate::plan::{Copies, Plan};
use crate::service::plan;
use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use pin_project_lite::pin_project;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use tokio::time::Instant;
use tower_once_core::attempt::Hedged;
use tower_once_core::body::BufferedBody;
use tower_once_core::classify::Classify;
use tower_once_core::replay::{Read, ReadForReplay, ReplayRequest};
use tower_once_core::shard::Padded;
use tower_service::Service;

type Req<B> = Request<BufferedBody<B>>;
type Core<S, B, C> = crate::ResponseFuture<S, Req<B>, ReplayRequest, C>;

/// The copies of an HTTP request read whole: its parts and its body, shared.
impl<B: Body> Copies<Req<B>> for ReplayRequest {
    fn copy(&self) -> Req<B> {
        ReplayRequest::copy(self)
    }
}

/// What the operation needs once the body is read.
pub(super) struct Reading<S, C> {
    pub(super) inner: S,
    pub(super) config: Arc<Padded<Config<S, C>>>,
}

pin_project! {
    /// Response future of [`HttpHedge`](super::HttpHedge).
    pub struct ResponseFuture<S, B, C>
    where
        S: Service<Req<B>>,
        B: Body,
    {
        #[pin]
        state: HttpState<Core<S, B, C>, ReadForReplay<B>>,
        reading: Option<Reading<S, C>>,
    }
}

pin_project! {
    #[project = HttpStateProj]
    enum HttpState<CF, Rd> {
        // The body, read for the copies, within the deadline the request carries.
        Reading { #[pin] read: Rd },
        Running { #[pin] core: CF },
    }
}

impl<S, B, C> ResponseFuture<S, B, C>
where
    S: Service<Req<B>>,
    B: Body,
{
    pub(super) fn running(
        first: S::Future,
        plan: Option<Plan<S, ReplayRequest>>,
        config: Arc<Padded<Config<S, C>>>,
        started: Instant,
    ) -> Self {
        Self {
            state: HttpState::Running {
                core: crate::ResponseFuture::new(first, plan, config, started),
            },
            reading: None,
        }
    }

    pub(super) fn reading(read: ReadForReplay<B>, reading: Reading<S, C>) -> Self {
        Self {
            state: HttpState::Reading { read },
            reading: Some(reading),
        }
    }
}

impl<S, B, ResB, C> Future for ResponseFuture<S, B, C>
where
    S: Service<Req<B>, Response = Response<ResB>> + Clone,
    B: Body<Data = Bytes>,
    C: Classify<Response<ResB>, S::Error>,
{
    type Output = Result<Response<ResB>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                HttpStateProj::Running { core } => return core.poll(cx),
                HttpStateProj::Reading { read } => {
                    let read = ready!(read.poll(cx));
                    let Some(Reading { mut inner, config }) = this.reading.take() else {
                        tower_once_core::polled_after_completion("HttpHedge's ResponseFuture");
                    };
                    // NOTE: the delay (and the latency observed) runs from when the first copy
                    // is sent, not from the call: a slow upload is not a slow answer.
                    let started = Instant::now();
                    let (first, plan) = match read {
                        Read::Whole(replay) => {
                            let mut first = replay.copy();
                            let plan = plan(&config, &first, || replay, started);
                            // NOTE: a fallback below learns that copies of this one may run.
                            if plan.is_some() {
                                Hedged::mark(&mut first);
                            }
                            (inner.call(first), plan)
                        }
                        // Not read whole (over the limit, failed, or cut at the deadline):
                        // sent once, unhedged; the layers below end it at its deadline.
                        Read::Once(req) | Read::Elapsed(req) => (inner.call(req), None),
                    };
                    this.state.set(HttpState::Running {
                        core: crate::ResponseFuture::new(first, plan, config, started),
                    });
                }
            }
        }
    }
}
