//! The response future: reading the body for copies, then the hedged operation.

use crate::config::Config;
use crate::future::{Copies, Plan};
use crate::service::plan;
use bytes::Bytes;
use http::request::Parts;
use http::{Request, Response};
use http_body::Body;
use pin_project_lite::pin_project;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::time::Instant;
use tower_once_core::attempt::Hedged;
use tower_once_core::body::{BufferedBody, Collected, Collector};
use tower_once_core::classify::Classify;
use tower_once_core::shard::Padded;
use tower_service::Service;

type Req<B> = Request<BufferedBody<B>>;
type Core<S, B, C> = crate::ResponseFuture<S, Req<B>, HttpCopies<B>, C>;

/// The copies of an HTTP request: its parts and its whole body.
pub struct HttpCopies<B> {
    parts: Parts,
    body: Bytes,
    _body: PhantomData<fn() -> B>,
}

impl<B> std::fmt::Debug for HttpCopies<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpCopies")
            .field("parts", &self.parts)
            .field("body", &self.body.len())
            .finish()
    }
}

impl<B: Body> Copies<Req<B>> for HttpCopies<B> {
    fn copy(&self) -> Req<B> {
        let mut req = Request::new(BufferedBody::full(self.body.clone()));
        *req.method_mut() = self.parts.method.clone();
        *req.uri_mut() = self.parts.uri.clone();
        *req.version_mut() = self.parts.version;
        *req.headers_mut() = self.parts.headers.clone();
        *req.extensions_mut() = self.parts.extensions.clone();
        req
    }
}

/// What the operation needs once the body is read.
pub(super) struct Reading<S, C> {
    pub(super) inner: S,
    pub(super) parts: Parts,
    pub(super) config: Arc<Padded<Config<S, C>>>,
    pub(super) limit: usize,
}

pin_project! {
    /// Response future of [`HttpHedge`](super::HttpHedge).
    pub struct ResponseFuture<S, B, C>
    where
        S: Service<Req<B>>,
        B: Body,
    {
        #[pin]
        state: HttpState<Core<S, B, C>, B>,
        reading: Option<Reading<S, C>>,
    }
}

pin_project! {
    #[project = HttpStateProj]
    enum HttpState<CF, B> {
        Reading { body: Option<Pin<Box<B>>>, collected: Collector },
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
        plan: Option<Plan<S, HttpCopies<B>>>,
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

    pub(super) fn reading(body: B, reading: Reading<S, C>) -> Self {
        Self {
            state: HttpState::Reading {
                body: Some(Box::pin(body)),
                collected: Collector::default(),
            },
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
                HttpStateProj::Reading { body, collected } => {
                    let (Some(stream), Some(reading)) = (body.as_mut(), this.reading.as_ref())
                    else {
                        tower_once_core::polled_after_completion("HttpHedge's ResponseFuture");
                    };
                    // Request trailers are not kept. A body that stalls is bound by the
                    // layers around (a deadline is not this layer's to enforce).
                    let mut trailers = None;
                    let Poll::Ready(outcome) =
                        collected.poll_collect(stream.as_mut(), reading.limit, &mut trailers, cx)
                    else {
                        return Poll::Pending;
                    };
                    let Some(Reading {
                        mut inner,
                        parts,
                        config,
                        ..
                    }) = this.reading.take()
                    else {
                        tower_once_core::polled_after_completion("HttpHedge's ResponseFuture");
                    };
                    let collected = std::mem::take(collected);
                    // NOTE: the delay (and the latency observed) runs from when the first copy
                    // is sent, not from the call: a slow upload is not a slow answer.
                    let started = Instant::now();
                    let (first, plan) = match (outcome, body.take()) {
                        (Collected::Complete, _) => {
                            let copies = HttpCopies {
                                parts,
                                body: collected.finish(),
                                _body: PhantomData,
                            };
                            let mut first = copies.copy();
                            let plan = plan(&config, &first, || copies, started);
                            // NOTE: a fallback below learns that copies of this one may run.
                            if plan.is_some() {
                                Hedged::mark(&mut first);
                            }
                            (inner.call(first), plan)
                        }
                        (Collected::Over(data), Some(rest)) => {
                            tracing::debug!("request body over the limit: sent once, unhedged");
                            let body = BufferedBody::prefixed(collected.finish_with(data), rest);
                            (inner.call(Request::from_parts(parts, body)), None)
                        }
                        (Collected::Failed(error), _) => {
                            let body = BufferedBody::failed(collected.finish(), error);
                            (inner.call(Request::from_parts(parts, body)), None)
                        }
                        (Collected::Over(_), None) => {
                            tower_once_core::polled_after_completion("HttpHedge's ResponseFuture")
                        }
                    };
                    this.state.set(HttpState::Running {
                        core: crate::ResponseFuture::new(first, plan, config, started),
                    });
                }
            }
        }
    }
}
