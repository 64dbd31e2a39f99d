use crate::attempt::is_marked;
use crate::classify::Classify;
use crate::config::Config;
use crate::error::RetryError;
use crate::future::ResponseFuture;
use crate::hook::OnRetry;
use crate::operation::Operation;
use std::task::{Context, Poll};
use tower_once_core::carrier::Carrier;
use tower_once_core::shard::PerThread;
use tower_once_timeout::Deadline;
use tower_service::Service;

/// Middleware that retries failed calls; built by [`RetryLayer`](crate::RetryLayer).
pub struct Retry<S, C = crate::classify::RetryOnError, H = ()> {
    inner: S,
    config: PerThread<Config<C, H>>,
}

impl<S, C, H> Retry<S, C, H> {
    pub(crate) fn new(inner: S, config: PerThread<Config<C, H>>) -> Self {
        Self { inner, config }
    }

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

impl<S: Clone, C, H> Clone for Retry<S, C, H> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            config: self.config.clone(),
        }
    }
}

impl<S: std::fmt::Debug, C, H> std::fmt::Debug for Retry<S, C, H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Retry")
            .field("inner", &self.inner)
            .field("config", self.config.get())
            .finish()
    }
}

impl<S, Req, C, H> Service<Req> for Retry<S, C, H>
where
    S: Service<Req> + Clone,
    Req: Clone + Carrier,
    C: Classify<S::Response, S::Error>,
    H: OnRetry<S::Response, S::Error>,
{
    type Response = S::Response;
    type Error = RetryError<S::Error>;
    type Future = ResponseFuture<S, Req, C, H>;

    /// Always ready: the inner service's readiness is awaited inside the operation, under its
    /// deadline, so a service that never becomes ready cannot hold a caller past it.
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Req) -> Self::Future {
        // NOTE: the request may carry an outer retry's mark and deadline (it crossed a task);
        // the scope has them when this call runs inside an outer attempt.
        let nested = is_marked(&req);
        if nested {
            tracing::trace!("nested RetryLayer: one attempt, the outer one retries");
        }
        let service = self.inner.clone();
        let outer = Deadline::of(&req);
        ResponseFuture::new(Operation::start(
            service,
            req,
            self.config.local(),
            outer,
            nested,
        ))
    }
}
