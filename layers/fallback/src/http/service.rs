//! The middleware: what the rule needs from the request, and the secondary that marks its
//! answers.

use super::future::{Pending, ResponseFuture};
use super::secondary::Secondary;
use crate::config::Config;
use crate::error::FallbackError;
use crate::hook::OnFallback;
use crate::rule::Facts;
use crate::service::deadline_for;
use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use std::fmt;
use std::task::{Context, Poll};
use tower_once_core::attempt::{Attempt, Hedged};
use tower_once_core::body::BufferedBody;
use tower_once_core::classify::{Classify, HttpClassifier};
use tower_once_core::replay::ReadForReplay;
use tower_once_core::resend::{is_idempotent, stamp_idempotency_key, SafeToRetry};
use tower_once_core::shard::PerThread;
use tower_once_core::unsent::Unsent;
use tower_once_core::IDEMPOTENCY_KEY;
use tower_service::Service;

/// Middleware built by [`HttpFallbackLayer`](super::HttpFallbackLayer): `P` is the primary,
/// `T` the secondary.
pub struct HttpFallback<P, T, C = HttpClassifier, H = ()> {
    pub(super) primary: P,
    pub(super) config: PerThread<Config<Secondary<T>, C, H>>,
    pub(super) body_limit: usize,
    pub(super) stamp: bool,
}

impl<P, T, C, H> HttpFallback<P, T, C, H> {
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

impl<P: Clone, T, C, H> Clone for HttpFallback<P, T, C, H> {
    fn clone(&self) -> Self {
        Self {
            primary: self.primary.clone(),
            config: self.config.clone(),
            body_limit: self.body_limit,
            stamp: self.stamp,
        }
    }
}

impl<P: fmt::Debug, T, C, H> fmt::Debug for HttpFallback<P, T, C, H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpFallback")
            .field("primary", &self.primary)
            .field("config", self.config.get())
            .field("body_limit", &self.body_limit)
            .field("stamp", &self.stamp)
            .finish()
    }
}

impl<P, T, B, ResB, C, H> Service<Request<B>> for HttpFallback<P, T, C, H>
where
    P: Service<Request<BufferedBody<B>>, Response = Response<ResB>> + Clone,
    P::Error: Unsent,
    T: Service<Request<BufferedBody<B>>, Response = Response<ResB>> + Clone,
    B: Body<Data = Bytes>,
    C: Classify<Response<ResB>, P::Error>,
    H: OnFallback<Response<ResB>, P::Error>,
{
    type Response = Response<ResB>;
    type Error = FallbackError<P::Error, T::Error>;
    type Future = ResponseFuture<P, T, B, C, H>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.primary.poll_ready(cx).map_err(FallbackError::primary)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        // NOTE: the key is stamped before the primary sees the request, so the secondary gets
        // the same one (a retry layer below would stamp its own, the secondary never seeing it).
        if self.stamp {
            stamp_idempotency_key(&mut req);
        }
        let facts = Facts {
            idempotent: is_idempotent(req.method())
                || req.extensions().get::<SafeToRetry>().is_some(),
            keyed: req.headers().contains_key(IDEMPOTENCY_KEY),
            // A retry's later attempt, a hedge, or a first copy that hedges may join: another
            // copy may have run on the primary.
            later_attempt: Attempt::of(&req).is_some_and(|a| !a.is_first()) || Hedged::is_on(&req),
        };
        let config = self.config.local();
        let deadline = deadline_for(&mut req, &config);
        let clone = self.primary.clone();
        let primary = std::mem::replace(&mut self.primary, clone);
        let read = ReadForReplay::new(
            req,
            self.body_limit,
            deadline.map(tower_once_timeout::Deadline::instant),
        );
        ResponseFuture::new(
            read,
            Pending {
                primary,
                facts,
                deadline,
                config,
            },
        )
    }
}
