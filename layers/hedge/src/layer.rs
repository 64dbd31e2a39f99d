use crate::config::{Config, When};
use crate::hook::OnHedge;
use crate::latency::Latency;
use crate::service::Hedge;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;
use tower_layer::Layer;
use tower_once_core::budget::RetryBudget;
use tower_once_core::classify::RetryOnError;
use tower_once_core::shard::PerThread;

/// Sends a copy of a slow request, and returns the first good answer. See the
/// [crate docs](crate); [`HttpHedgeLayer`](crate::http::HttpHedgeLayer) is the form for
/// `http::Request`s, which hedges only requests safe to run twice.
///
/// Every request this layer sees is hedged: use it for requests that are safe to run twice
/// (reads, or operations the server deduplicates).
///
/// ```
/// use std::time::Duration;
/// use tower_once_hedge::HedgeLayer;
/// use tower_once_retry::{budget::RetryBudget, RetryLayer};
///
/// // One budget for retries and hedges: together they add at most about 20 % load.
/// let budget = RetryBudget::default();
/// let stack = tower::ServiceBuilder::new()
///     .layer(RetryLayer::new().budget(budget.clone()))
///     .layer(HedgeLayer::latency_percentile(0.95, 100, Duration::from_secs(10)).budget(budget));
/// # let _ = stack;
/// ```
#[derive(Clone)]
pub struct HedgeLayer<C = RetryOnError> {
    when: When,
    max_hedges: u32,
    budget: Option<RetryBudget>,
    classifier: C,
    hook: Option<Arc<dyn OnHedge>>,
}

impl HedgeLayer {
    /// Hedges a request still unanswered `delay` after its call (and again `delay` after each
    /// hedge, up to [`max_hedges`](Self::max_hedges)); one hedge at most by default, drawing on
    /// a [`RetryBudget`] of its own unless given one to share with the retry layer.
    pub fn new(delay: Duration) -> Self {
        Self {
            when: When::After(delay),
            max_hedges: 1,
            budget: Some(RetryBudget::default()),
            classifier: RetryOnError,
            hook: None,
        }
    }

    /// Hedges a request still unanswered after the `percentile` (say 0.95) of the latencies
    /// of successful first attempts in the last `period`, as tower's hedge; no hedge until a
    /// period with at least `min_data_points` latencies has passed.
    ///
    /// # Panics
    ///
    /// If `percentile` is not in `(0, 1)`, or `period` is shorter than 1 ms.
    pub fn latency_percentile(percentile: f64, min_data_points: u64, period: Duration) -> Self {
        assert!(
            percentile > 0.0 && percentile < 1.0,
            "HedgeLayer::latency_percentile: the percentile must be in (0, 1)"
        );
        assert!(
            period >= Duration::from_millis(1),
            "HedgeLayer::latency_percentile: the period must be at least 1 ms"
        );
        Self {
            when: When::Percentile(Arc::new(Latency::new(percentile, min_data_points, period))),
            ..Self::new(Duration::ZERO)
        }
    }
}

impl<C> HedgeLayer<C> {
    /// The most hedges per request, beside the first attempt. Default 1.
    ///
    /// # Panics
    ///
    /// If `hedges` is zero.
    pub fn max_hedges(mut self, hedges: u32) -> Self {
        assert!(hedges > 0, "HedgeLayer::max_hedges must be at least 1");
        self.max_hedges = hedges;
        self
    }

    /// The budget hedges draw on; pass the retry layer's, so that retries and hedges together
    /// stay within one share of the load (gRPC's one throttle for both).
    pub fn budget(mut self, budget: RetryBudget) -> Self {
        self.budget = Some(budget);
        self
    }

    /// No budget: only `max_hedges` and the deadline bound hedges.
    pub fn no_budget(mut self) -> Self {
        self.budget = None;
        self
    }

    /// Calls `hook` each time a hedge is sent ([`OnHedge`]: a closure, or `()` for none).
    pub fn on_hedge(mut self, hook: impl OnHedge) -> Self {
        self.hook = Some(Arc::new(hook));
        self
    }

    /// How outcomes are classified: `Success` and `Stop` are the answer; `Retry` waits for
    /// the other copies (and is returned when none answers better); `InProgress` (another copy
    /// holds the server's claim) waits for the others too.
    pub fn classify<C2>(self, classifier: C2) -> HedgeLayer<C2> {
        HedgeLayer {
            when: self.when,
            max_hedges: self.max_hedges,
            budget: self.budget,
            classifier,
            hook: self.hook,
        }
    }

    pub(crate) fn config<S>(&self, service: S) -> Config<S, C>
    where
        C: Clone,
    {
        Config {
            service,
            when: self.when.clone(),
            max_hedges: self.max_hedges,
            budget: self.budget.clone(),
            classifier: self.classifier.clone(),
            hook: self.hook.clone(),
        }
    }
}

impl<S: Clone, C: Clone> Layer<S> for HedgeLayer<C> {
    type Service = Hedge<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        Hedge {
            config: PerThread::new(self.config(inner.clone())),
            inner,
        }
    }
}

impl<C> fmt::Debug for HedgeLayer<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HedgeLayer")
            .field("when", &self.when)
            .field("max_hedges", &self.max_hedges)
            .field("budget", &self.budget)
            .field("classifier", &std::any::type_name::<C>())
            .field("hook", &self.hook.is_some())
            .finish()
    }
}
