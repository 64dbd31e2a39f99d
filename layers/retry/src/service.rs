use crate::classify::Classify;
use crate::error::RetryError;
use crate::future::{Operation, ResponseFuture};
use crate::hook::OnRetry;
use crate::layer::{Config, SharedConfig};
use crate::shard::PerThread;
use std::cell::Cell;
use std::task::{Context, Poll};
use std::time::Duration;
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

thread_local! {
    // NOTE: set while an attempt's `call` runs (see `in_attempt`); a `Retry` called inside it
    // is nested in another one and makes a single attempt, so stacked layers do not multiply.
    static IN_ATTEMPT: Cell<bool> = const { Cell::new(false) };
}

/// Runs an attempt's `call` under the operation's deadline and the nested-retry marker.
pub(crate) fn in_attempt<R>(deadline: Deadline, call: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            IN_ATTEMPT.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(IN_ATTEMPT.with(|c| c.replace(true)));
    deadline.scope(call)
}

/// Whether this call is an attempt of an outer retry (which then does the retrying).
pub(crate) fn is_nested() -> bool {
    IN_ATTEMPT.with(Cell::get)
}

/// Starts an operation: counts it, fixes its deadline, and makes the first attempt on
/// `service`, which must be ready.
/// Marks a request sent by a retry attempt, so that a retry layer below it (even across a
/// `tower::buffer::Buffer` or a spawned task, where the thread-local mark does not reach)
/// defers to the outer one instead of multiplying attempts.
#[derive(Debug, Clone, Copy)]
pub(crate) struct InAttempt;

/// Starts an operation: its deadline is this layer's own or `outer`, whichever ends first. A
/// `nested` operation (inside another layer's attempt) makes one attempt and is not counted:
/// the outer layer counts and retries.
pub(crate) fn start<S, Req, C, H>(
    service: S,
    req: Req,
    config: SharedConfig<C, H>,
    outer: Option<Deadline>,
    nested: bool,
) -> ResponseFuture<S, Req, C, H>
where
    S: Service<Req>,
    Req: Clone,
{
    let settings = &config.settings;
    // One clock reading serves the deadline and the budget: it is most of the happy path's cost.
    let now = tokio::time::Instant::now();
    if !nested {
        settings.stats.operation();
        if let Some(budget) = &settings.budget {
            budget.deposit_at(now);
        }
    }
    let own = Deadline::at(tower_once_core::time::saturating_add(
        now,
        settings.deadline,
    ));
    let deadline = match outer {
        Some(outer) if outer < own => outer,
        _ => own,
    };
    ResponseFuture::new(Operation {
        service,
        request: req,
        config,
        deadline,
        attempt: 0,
        nested,
        previous_delay: Duration::ZERO,
        rng: None,
    })
}

impl<S, Req, C, H> Service<Req> for Retry<S, C, H>
where
    S: Service<Req> + Clone,
    Req: Clone,
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
        let nested = is_nested();
        if nested {
            tracing::trace!("nested RetryLayer: one attempt, the outer one retries");
        }
        let service = self.inner.clone();
        start(
            service,
            req,
            self.config.local(),
            Deadline::current(),
            nested,
        )
    }
}
