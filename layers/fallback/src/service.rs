//! The middleware: the primary first, with a copy of the request kept for the secondary.

use crate::config::Config;
use crate::error::FallbackError;
use crate::future::{Held, ResponseFuture};
use crate::hook::OnFallback;
use crate::rule::Facts;
use std::fmt;
use std::task::{Context, Poll};
use tower_once_core::attempt::{Attempt, CopyWatch, Hedged};
use tower_once_core::carrier::Carrier;
use tower_once_core::classify::Classify;
use tower_once_core::shard::PerThread;
use tower_once_core::unsent::Unsent;
use tower_once_timeout::Deadline;
use tower_service::Service;

/// Middleware built by [`FallbackLayer`](crate::FallbackLayer): `P` is the primary, `T` the
/// secondary.
pub struct Fallback<P, T, C = tower_once_core::classify::RetryOnError, H = ()> {
    pub(crate) primary: P,
    pub(crate) config: PerThread<Config<T, C, H>>,
}

impl<P, T, C, H> Fallback<P, T, C, H> {
    /// The primary service.
    pub fn get_ref(&self) -> &P {
        &self.primary
    }

    /// The primary service, mutably.
    pub fn get_mut(&mut self) -> &mut P {
        &mut self.primary
    }

    /// The primary service, consuming this one.
    pub fn into_inner(self) -> P {
        self.primary
    }
}

impl<P: Clone, T, C, H> Clone for Fallback<P, T, C, H> {
    fn clone(&self) -> Self {
        Self {
            primary: self.primary.clone(),
            config: self.config.clone(),
        }
    }
}

impl<P: fmt::Debug, T, C, H> fmt::Debug for Fallback<P, T, C, H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fallback")
            .field("primary", &self.primary)
            .field("config", self.config.get())
            .finish()
    }
}

/// The operation's deadline: the layer's own or the one the request carries (or is in
/// scope), whichever is earlier; put on the request so both sides see it.
pub(crate) fn deadline_for<Req: Carrier, T, C, H>(
    req: &mut Req,
    config: &Config<T, C, H>,
) -> Option<Deadline> {
    let own = config.deadline.map(Deadline::after);
    let deadline = Deadline::earliest(own, Deadline::of(req));
    if let Some(deadline) = deadline {
        deadline.attach(req);
    }
    deadline
}

impl<P, T, Req, C, H> Service<Req> for Fallback<P, T, C, H>
where
    P: Service<Req>,
    P::Error: Unsent,
    T: Service<Req, Response = P::Response> + Clone,
    Req: Clone + Carrier,
    C: Classify<P::Response, P::Error>,
    H: OnFallback<P::Response, P::Error>,
{
    type Response = P::Response;
    type Error = FallbackError<P::Error, T::Error>;
    type Future = ResponseFuture<P::Future, T, Req, C, H>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.primary.poll_ready(cx).map_err(FallbackError::primary)
    }

    fn call(&mut self, mut req: Req) -> Self::Future {
        let config = self.config.local();
        let deadline = deadline_for(&mut req, &config);
        // A plain request cannot say whether it is idempotent or keyed: the layer's settings
        // speak for it.
        let facts = Facts {
            idempotent: false,
            keyed: true,
            // A retry's later attempt, a hedge, or a first copy that hedges may join: another
            // copy may have run on the primary.
            later_attempt: Attempt::of(&req).is_some_and(|a| !a.is_first()) || Hedged::is_on(&req),
        };
        let held = Held {
            request: req.clone(),
            facts,
        };
        let watch = CopyWatch::attach(&mut req);
        let primary = match deadline {
            Some(deadline) => deadline.scope(|| self.primary.call(req)),
            None => self.primary.call(req),
        };
        ResponseFuture::new(primary, held, watch, deadline, config)
    }
}
