use super::secondary::Secondary;
use super::service::HttpFallback;
use crate::config::Config;
use crate::FallbackLayer;
use std::fmt;
use std::time::Duration;
use tower_layer::Layer;
use tower_once_core::classify::HttpClassifier;
use tower_once_core::shard::PerThread;

/// The fallback for `http::Request`s. See the [module docs](crate::http) and the
/// [crate docs](crate) for the rule.
#[derive(Clone)]
pub struct HttpFallbackLayer<T, C = HttpClassifier, H = ()> {
    fallback: FallbackLayer<T, C, H>,
    body_limit: usize,
    stamp: bool,
}

impl<T> HttpFallbackLayer<T> {
    /// Falls back to `secondary`, classifying outcomes with [`HttpClassifier`] (transport
    /// errors, `5xx`, `429`, `408` and `409` in progress are failures); a 1 MiB body limit; no
    /// key stamping.
    pub fn new(secondary: T) -> Self {
        FallbackLayer::new(secondary)
            .classify(HttpClassifier)
            .into_http()
    }
}

impl<T, C, H> FallbackLayer<T, C, H> {
    /// This layer for `http::Request`s: see [`http`](crate::http).
    pub fn into_http(self) -> HttpFallbackLayer<T, C, H> {
        HttpFallbackLayer {
            fallback: self,
            body_limit: tower_once_core::replay::DEFAULT_BODY_LIMIT,
            stamp: false,
        }
    }
}

impl<T, C, H> HttpFallbackLayer<T, C, H> {
    fn map<C2, H2>(
        self,
        f: impl FnOnce(FallbackLayer<T, C, H>) -> FallbackLayer<T, C2, H2>,
    ) -> HttpFallbackLayer<T, C2, H2> {
        HttpFallbackLayer {
            fallback: f(self.fallback),
            body_limit: self.body_limit,
            stamp: self.stamp,
        }
    }

    /// See [`FallbackLayer::side_effect_free`].
    pub fn side_effect_free(self, free: bool) -> Self {
        self.map(|f| f.side_effect_free(free))
    }

    /// See [`FallbackLayer::shares_records`]: here only a request that carries an
    /// `Idempotency-Key` (its own, or stamped) goes.
    pub fn shares_records(self, shared: bool) -> Self {
        self.map(|f| f.shares_records(shared))
    }

    /// See [`FallbackLayer::deadline`].
    pub fn deadline(self, deadline: Duration) -> Self {
        self.map(|f| f.deadline(deadline))
    }

    /// See [`FallbackLayer::classify`].
    pub fn classify<C2>(self, classifier: C2) -> HttpFallbackLayer<T, C2, H> {
        self.map(|f| f.classify(classifier))
    }

    /// See [`FallbackLayer::on_fallback`].
    pub fn on_fallback<H2>(self, hook: H2) -> HttpFallbackLayer<T, C, H2> {
        self.map(|f| f.on_fallback(hook))
    }

    /// The largest request body read for the secondary; a larger one goes to the primary only.
    /// Default 1 MiB.
    pub fn body_limit(mut self, limit: usize) -> Self {
        self.body_limit = limit;
        self
    }

    /// Whether an unkeyed `POST` or `PATCH` gets a fresh `Idempotency-Key` before the primary
    /// sees it, so the secondary gets the same one. Default `false`.
    pub fn stamp_idempotency_keys(mut self, stamp: bool) -> Self {
        self.stamp = stamp;
        self
    }
}

impl<P, T: Clone, C: Clone, H: Clone> Layer<P> for HttpFallbackLayer<T, C, H> {
    type Service = HttpFallback<P, T, C, H>;

    fn layer(&self, primary: P) -> Self::Service {
        let c = &self.fallback.config;
        HttpFallback {
            primary,
            config: PerThread::new(Config {
                secondary: Secondary(c.secondary.clone()),
                safety: c.safety,
                deadline: c.deadline,
                classifier: c.classifier.clone(),
                hook: c.hook.clone(),
            }),
            body_limit: self.body_limit,
            stamp: self.stamp,
        }
    }
}

impl<T, C, H> fmt::Debug for HttpFallbackLayer<T, C, H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpFallbackLayer")
            .field("fallback", &self.fallback)
            .field("body_limit", &self.body_limit)
            .field("stamp", &self.stamp)
            .finish()
    }
}
