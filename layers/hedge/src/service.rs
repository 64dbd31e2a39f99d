//! The middleware: the first attempt, and the plan for hedges.

use crate::config::Config;
use crate::future::ResponseFuture;
use crate::plan::{Cloned, Plan};
use std::fmt;
use std::task::{Context, Poll};
use tokio::time::Instant;
use tower_once_core::attempt::{Attempt, Hedged};
use tower_once_core::carrier::Carrier;
use tower_once_core::classify::Classify;
use tower_once_core::deadline::Deadline;
use tower_once_core::shard::PerThread;
use tower_service::Service;

/// Middleware built by [`HedgeLayer`](crate::HedgeLayer).
pub struct Hedge<S, C = tower_once_core::classify::RetryOnError> {
    pub(crate) inner: S,
    pub(crate) config: PerThread<Config<S, C>>,
}

impl<S, C> Hedge<S, C> {
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

impl<S: Clone, C> Clone for Hedge<S, C> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            config: self.config.clone(),
        }
    }
}

impl<S: fmt::Debug, C> fmt::Debug for Hedge<S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hedge")
            .field("inner", &self.inner)
            .field("config", self.config.get())
            .finish()
    }
}

/// The plan for an operation's hedges: none when the delay is unknown (too few latencies
/// observed yet) or the deadline leaves no room for one. Deposits the operation in the budget
/// when no retry layer above did.
pub(crate) fn plan<S, C, Req: Carrier, K>(
    config: &Config<S, C>,
    req: &Req,
    source: impl FnOnce() -> K,
    now: Instant,
) -> Option<Plan<S, K>> {
    let outer = Attempt::of(req);
    if let (Some(budget), None) = (&config.budget, outer) {
        budget.deposit();
    }
    // NOTE: the one safety rule for every form of the layer (an unkeyed `POST` is never
    // hedged, even by the generic layer on an `http::Request`).
    if !req.may_send_twice() {
        return None;
    }
    let delay = config.when.delay(now)?;
    let deadline = Deadline::of(req);
    if deadline.is_some_and(|d| d.instant() <= tower_once_core::time::saturating_add(now, delay)) {
        return None;
    }
    Some(Plan {
        source: source(),
        delay,
        left: config.max_hedges,
        deadline,
        mark: outer.unwrap_or(Attempt::FIRST).hedge(),
        service: None,
    })
}

impl<S, Req, C> Service<Req> for Hedge<S, C>
where
    S: Service<Req> + Clone,
    Req: Clone + Carrier,
    C: Classify<S::Response, S::Error>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = ResponseFuture<S, Req, Cloned<Req>, C>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Req) -> Self::Future {
        let config = self.config.local();
        let now = Instant::now();
        let plan = plan(&config, &req, || Cloned(req.clone()), now);
        if plan.is_some() {
            Hedged::mark(&mut req);
        }
        ResponseFuture::new(self.inner.call(req), plan, config, now)
    }
}
