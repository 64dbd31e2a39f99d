//! The middleware: which requests are hedged.

use super::future::{Reading, ResponseFuture};
use crate::config::Config;
use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use std::fmt;
use std::task::{Context, Poll};
use tokio::time::Instant;
use tower_once_core::body::BufferedBody;
use tower_once_core::classify::{Classify, HttpClassifier};
use tower_once_core::deadline::Deadline;
use tower_once_core::replay::ReadForReplay;
use tower_once_core::resend::{may_resend, stamp_idempotency_key};
use tower_once_core::shard::PerThread;
use tower_service::Service;

/// Middleware built by [`HttpHedgeLayer`](super::HttpHedgeLayer).
pub struct HttpHedge<S, C = HttpClassifier> {
    pub(super) inner: S,
    pub(super) config: PerThread<Config<S, C>>,
    pub(super) body_limit: usize,
    pub(super) stamp: bool,
}

impl<S, C> HttpHedge<S, C> {
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

impl<S: Clone, C> Clone for HttpHedge<S, C> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            config: self.config.clone(),
            body_limit: self.body_limit,
            stamp: self.stamp,
        }
    }
}

impl<S: fmt::Debug, C> fmt::Debug for HttpHedge<S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpHedge")
            .field("inner", &self.inner)
            .field("config", self.config.get())
            .field("body_limit", &self.body_limit)
            .field("stamp", &self.stamp)
            .finish()
    }
}

impl<S, B, ResB, C> Service<Request<B>> for HttpHedge<S, C>
where
    S: Service<Request<BufferedBody<B>>, Response = Response<ResB>> + Clone,
    B: Body<Data = Bytes>,
    C: Classify<Response<ResB>, S::Error>,
{
    type Response = Response<ResB>;
    type Error = S::Error;
    type Future = ResponseFuture<S, B, C>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        let started = Instant::now();
        if self.stamp {
            stamp_idempotency_key(&mut req);
        }
        let config = self.config.local();
        // NOTE: only a request that may be sent more than once is hedged: the rule every
        // layer applies (an idempotent method, a key, a SafeToRetry mark).
        if !may_resend(&req) {
            tracing::trace!(method = %req.method(), "not safe to send twice: not hedged");
            let future = self.inner.call(req.map(BufferedBody::streaming));
            return ResponseFuture::running(future, None, config, started);
        }
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        // NOTE: a body that stalls is cut at the deadline the request carries: from then on
        // the request goes down once, unhedged, for the layers below to end.
        let deadline = Deadline::of(&req).map(Deadline::instant);
        ResponseFuture::reading(
            ReadForReplay::new(req, self.body_limit, deadline),
            Reading { inner, config },
        )
    }
}
