use super::service::HttpHedge;
use crate::HedgeLayer;
use std::fmt;
use std::time::Duration;
use tower_layer::Layer;
use tower_once_core::budget::RetryBudget;
use tower_once_core::classify::HttpClassifier;
use tower_once_core::shard::PerThread;

/// Hedging for `http::Request`s. See the [module docs](crate::http).
#[derive(Clone)]
pub struct HttpHedgeLayer<C = HttpClassifier> {
    hedge: HedgeLayer<C>,
    body_limit: usize,
    stamp: bool,
}

impl HttpHedgeLayer {
    /// [`HedgeLayer::new`] with [`HttpClassifier`], a 1 MiB body limit, no key stamping.
    pub fn new(delay: Duration) -> Self {
        HedgeLayer::new(delay).classify(HttpClassifier).into_http()
    }

    /// [`HedgeLayer::latency_percentile`] with [`HttpClassifier`].
    ///
    /// # Panics
    ///
    /// As [`HedgeLayer::latency_percentile`].
    pub fn latency_percentile(percentile: f64, min_data_points: u64, period: Duration) -> Self {
        HedgeLayer::latency_percentile(percentile, min_data_points, period)
            .classify(HttpClassifier)
            .into_http()
    }
}

impl<C> HedgeLayer<C> {
    /// This layer for `http::Request`s: see [`http`](crate::http).
    pub fn into_http(self) -> HttpHedgeLayer<C> {
        HttpHedgeLayer {
            hedge: self,
            body_limit: tower_once_core::replay::DEFAULT_BODY_LIMIT,
            stamp: false,
        }
    }
}

impl<C> HttpHedgeLayer<C> {
    /// See [`HedgeLayer::max_hedges`].
    ///
    /// # Panics
    ///
    /// If `hedges` is zero.
    pub fn max_hedges(mut self, hedges: u32) -> Self {
        self.hedge = self.hedge.max_hedges(hedges);
        self
    }

    /// See [`HedgeLayer::on_hedge`].
    pub fn on_hedge(mut self, hook: impl crate::hook::OnHedge) -> Self {
        self.hedge = self.hedge.on_hedge(hook);
        self
    }

    /// See [`HedgeLayer::budget`].
    pub fn budget(mut self, budget: RetryBudget) -> Self {
        self.hedge = self.hedge.budget(budget);
        self
    }

    /// See [`HedgeLayer::no_budget`].
    pub fn no_budget(mut self) -> Self {
        self.hedge = self.hedge.no_budget();
        self
    }

    /// See [`HedgeLayer::classify`].
    pub fn classify<C2>(self, classifier: C2) -> HttpHedgeLayer<C2> {
        HttpHedgeLayer {
            hedge: self.hedge.classify(classifier),
            body_limit: self.body_limit,
            stamp: self.stamp,
        }
    }

    /// The largest request body read for copies; a larger one is sent once, unhedged.
    /// Default 1 MiB.
    pub fn body_limit(mut self, limit: usize) -> Self {
        self.body_limit = limit;
        self
    }

    /// Whether an unkeyed `POST` or `PATCH` gets a fresh `Idempotency-Key` (the same on every
    /// copy) and so is hedged. Default `false`.
    pub fn stamp_idempotency_keys(mut self, stamp: bool) -> Self {
        self.stamp = stamp;
        self
    }
}

impl<S: Clone, C: Clone> Layer<S> for HttpHedgeLayer<C> {
    type Service = HttpHedge<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        HttpHedge {
            config: PerThread::new(self.hedge.config(inner.clone())),
            inner,
            body_limit: self.body_limit,
            stamp: self.stamp,
        }
    }
}

impl<C> fmt::Debug for HttpHedgeLayer<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpHedgeLayer")
            .field("hedge", &self.hedge)
            .field("body_limit", &self.body_limit)
            .field("stamp", &self.stamp)
            .finish()
    }
}
