//! The layer and its builder.

use super::service::HttpRetry;
use crate::backoff::Backoff;
use crate::budget::RetryBudget;
use crate::classify::{HttpClassifier, HttpDefault};
use crate::config::Config;
use crate::hook::StatsSnapshot;
use crate::RetryLayer;
use std::time::Duration;
use tower_layer::Layer;
use tower_once_core::shard::PerThread;

/// The HTTP retry layer. See the [module docs](crate::http).
#[derive(Clone)]
pub struct HttpRetryLayer<C = HttpClassifier, H = ()> {
    retry: RetryLayer<C, H>,
    body_limit: usize,
    stamp: bool,
}

impl HttpRetryLayer {
    /// [`RetryLayer::new`] with [`HttpClassifier`], a 1 MiB replay buffer, no key stamping.
    pub fn new() -> Self {
        RetryLayer::new().classify(HttpClassifier).into_http()
    }
}

impl Default for HttpRetryLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl<C, H> RetryLayer<C, H> {
    /// This layer for `http::Request`s with bodies that need not be `Clone`: see
    /// [`http`](crate::http).
    pub fn into_http(self) -> HttpRetryLayer<C, H> {
        HttpRetryLayer {
            retry: self,
            body_limit: tower_once_core::replay::DEFAULT_BODY_LIMIT,
            stamp: false,
        }
    }
}

impl<C, H> HttpRetryLayer<C, H> {
    /// See [`RetryLayer::max_attempts`].
    ///
    /// # Panics
    ///
    /// If `attempts` is zero.
    pub fn max_attempts(self, attempts: u32) -> Self {
        self.map(|r| r.max_attempts(attempts))
    }

    /// See [`RetryLayer::backoff`].
    pub fn backoff(self, backoff: Backoff) -> Self {
        self.map(|r| r.backoff(backoff))
    }

    /// See [`RetryLayer::retry_after_cap`].
    pub fn retry_after_cap(self, cap: Duration) -> Self {
        self.map(|r| r.retry_after_cap(cap))
    }

    /// See [`RetryLayer::deadline`].
    ///
    /// # Panics
    ///
    /// If `deadline` is zero.
    pub fn deadline(self, deadline: Duration) -> Self {
        self.map(|r| r.deadline(deadline))
    }

    /// See [`RetryLayer::budget`].
    pub fn budget(self, budget: RetryBudget) -> Self {
        self.map(|r| r.budget(budget))
    }

    /// See [`RetryLayer::no_budget`].
    pub fn no_budget(self) -> Self {
        self.map(RetryLayer::no_budget)
    }

    /// See [`RetryLayer::rng_seed`].
    pub fn rng_seed(self, seed: u64) -> Self {
        self.map(|r| r.rng_seed(seed))
    }

    /// See [`RetryLayer::classify`]: replaces the default [`HttpClassifier`].
    pub fn classify<C2>(self, classifier: C2) -> HttpRetryLayer<C2, H> {
        HttpRetryLayer {
            retry: self.retry.classify(classifier),
            body_limit: self.body_limit,
            stamp: self.stamp,
        }
    }

    /// See [`RetryLayer::on_retry`].
    pub fn on_retry<H2>(self, hook: H2) -> HttpRetryLayer<C, H2> {
        HttpRetryLayer {
            retry: self.retry.on_retry(hook),
            body_limit: self.body_limit,
            stamp: self.stamp,
        }
    }

    fn map(mut self, f: impl FnOnce(RetryLayer<C, H>) -> RetryLayer<C, H>) -> Self {
        self.retry = f(self.retry);
        self
    }

    /// The largest request body buffered for replay; larger ones go out once. Default 1 MiB,
    /// the same as `IdempotencyLayer`'s request body limit, so a request the server accepts
    /// can be retried; the buffer lives only while the request is in flight.
    pub fn body_limit(mut self, limit: usize) -> Self {
        self.body_limit = limit;
        self
    }

    /// Whether an unkeyed `POST` or `PATCH` gets a fresh `Idempotency-Key` (a UUID v4, the same
    /// on every attempt) so it can be retried. Default `false`.
    pub fn stamp_idempotency_keys(mut self, stamp: bool) -> Self {
        self.stamp = stamp;
        self
    }

    /// The counters of this layer and every service it made.
    pub fn stats(&self) -> StatsSnapshot {
        self.retry.stats()
    }
}

impl<C: std::fmt::Debug, H> std::fmt::Debug for HttpRetryLayer<C, H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpRetryLayer")
            .field("retry", &self.retry)
            .field("body_limit", &self.body_limit)
            .field("stamp", &self.stamp)
            .finish()
    }
}

impl<S, C: Clone, H: Clone> Layer<S> for HttpRetryLayer<C, H> {
    type Service = HttpRetry<S, C, H>;

    fn layer(&self, inner: S) -> Self::Service {
        let config = self.retry.config();
        HttpRetry {
            inner,
            config: PerThread::new(Config {
                settings: config.settings.clone(),
                classifier: HttpDefault::new(
                    config.classifier.clone(),
                    config.settings.classifier_set,
                ),
                hook: config.hook.clone(),
            }),
            body_limit: self.body_limit,
            stamp: self.stamp,
        }
    }
}
