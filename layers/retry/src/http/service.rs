//! The middleware: which requests are retried, and how an operation starts.

use super::future::{Pending, ResponseFuture, Started};
use super::replay::Rebuild;
use crate::attempt::{call_once, is_marked};
use crate::classify::{Classify, HttpClassifier, HttpDefault};
use crate::config::Config;
use crate::error::{GiveUp, RetryError};
use crate::hook::OnRetry;
use crate::operation::Operation;
use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use std::task::{Context, Poll};
use tower_once_core::body::BufferedBody;
use tower_once_core::replay::{ReadForReplay, ReplayRequest};
use tower_once_core::resend::{may_resend, stamp_idempotency_key};
use tower_once_core::shard::PerThread;
use tower_once_core::time::saturating_add;
use tower_once_core::IDEMPOTENCY_KEY;
use tower_once_timeout::Deadline;
use tower_service::Service;

/// Middleware built by [`HttpRetryLayer`](super::HttpRetryLayer).
pub struct HttpRetry<S, C = HttpClassifier, H = ()> {
    pub(super) inner: S,
    pub(super) config: PerThread<Config<HttpDefault<C>, H>>,
    pub(super) body_limit: usize,
    pub(super) stamp: bool,
}

impl<S, C, H> HttpRetry<S, C, H> {
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

impl<S: Clone, C, H> Clone for HttpRetry<S, C, H> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            config: self.config.clone(),
            body_limit: self.body_limit,
            stamp: self.stamp,
        }
    }
}

impl<S: std::fmt::Debug, C, H> std::fmt::Debug for HttpRetry<S, C, H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpRetry")
            .field("inner", &self.inner)
            .field("body_limit", &self.body_limit)
            .field("stamp", &self.stamp)
            .finish()
    }
}

impl<S, B, ResB, C, H> Service<Request<B>> for HttpRetry<S, C, H>
where
    S: Service<Request<BufferedBody<B>>, Response = Response<ResB>> + Clone,
    B: Body<Data = Bytes>,
    C: Classify<Response<ResB>, S::Error>,
    H: OnRetry<Response<ResB>, S::Error>,
{
    type Response = Response<ResB>;
    type Error = RetryError<S::Error>;
    type Future = ResponseFuture<S, B, HttpDefault<C>, H>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner
            .poll_ready(cx)
            .map_err(|e| RetryError::new(GiveUp::NotRetryable, 0, e))
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        let now = tokio::time::Instant::now();
        let deadline = operation_deadline(self.config.get(), &req, now);
        let started = |req: &Request<_>| Started {
            key: req.headers().get(IDEMPOTENCY_KEY).cloned(),
            at: now,
        };
        if is_marked(&req) {
            // One attempt, still bound by this layer's own deadline when it is the shorter.
            tracing::trace!("nested RetryLayer: one attempt, the outer one retries");
            let clone = self.inner.clone();
            let service = std::mem::replace(&mut self.inner, clone);
            let started = started(&req);
            if deadline.instant() <= now {
                return ResponseFuture::expired(started);
            }
            let req = req.map(BufferedBody::streaming);
            return ResponseFuture::once(call_once(service, req, deadline), deadline, started);
        }
        // NOTE: a request marked safe to retry gets no key: it may go to a provider that
        // ignores (or refuses) the header.
        if self.stamp {
            stamp_idempotency_key(&mut req);
        }
        let clone = self.inner.clone();
        let service = std::mem::replace(&mut self.inner, clone);
        let started = started(&req);
        if !may_resend(&req) {
            tracing::debug!(method = %req.method(), "unsafe request without an Idempotency-Key: one attempt");
            // NOTE: no attempt starts once the deadline has passed, this one included.
            if deadline.instant() <= now {
                return ResponseFuture::expired(started);
            }
            let stats = &self.config.get().settings.stats;
            stats.operation();
            stats.attempt();
            return ResponseFuture::once(
                call_once(service, req.map(BufferedBody::streaming), deadline),
                deadline,
                started,
            );
        }
        let config = self.config.local();
        if ReadForReplay::is_ended(&req) {
            let replay = ReplayRequest::new(req.into_parts().0, Bytes::new());
            return ResponseFuture::retrying(
                crate::ResponseFuture::new(Operation::start(
                    Rebuild::new(service),
                    replay,
                    config,
                    Some(deadline),
                    false,
                )),
                started,
            );
        }
        ResponseFuture::reading(
            ReadForReplay::new(req, self.body_limit, Some(deadline.instant())),
            Pending {
                service,
                config,
                deadline,
            },
            started,
        )
    }
}

/// The operation's deadline: this layer's own, or an earlier one the request already carries
/// (in its extensions, from an outer layer across a `Buffer`, or in the call scope).
fn operation_deadline<C, H, B>(
    config: &Config<C, H>,
    req: &Request<B>,
    now: tokio::time::Instant,
) -> Deadline {
    Deadline::at(saturating_add(now, config.settings.deadline)).tightened(Deadline::of(req))
}
