use crate::backoff::Backoff;
use crate::budget::RetryBudget;
use crate::classify::RetryOnError;
use crate::config::{Config, Settings};
use crate::hook::StatsSnapshot;
use crate::service::Retry;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tower_layer::Layer;
use tower_once_core::shard::PerThread;

/// Retries failed calls of any tower service: classified, backed off with jitter, bounded by
/// attempts, one deadline and a shared retry budget. See the [crate docs](crate).
///
/// ```
/// use std::time::Duration;
/// use tower_once_retry::{backoff::Backoff, RetryLayer};
///
/// let layer = RetryLayer::new()
///     .max_attempts(3)
///     .backoff(Backoff::new(Duration::from_millis(100), 2.0, Duration::from_secs(2)).unwrap())
///     .deadline(Duration::from_secs(10));
/// # let _ = layer;
/// ```
#[derive(Clone)]
pub struct RetryLayer<C = RetryOnError, H = ()> {
    config: Config<C, H>,
}

impl RetryLayer {
    /// A layer with the defaults: 4 attempts in all, backoff from 500 ms doubling to at most
    /// 8 s with full jitter, `Retry-After` capped at 60 s, a 30 s deadline over all attempts
    /// and waits, the default [`RetryBudget`](crate::budget::RetryBudget) (20 % + 10/s over
    /// 10 s), and [`RetryOnError`].
    pub fn new() -> Self {
        Self {
            config: Config {
                settings: Settings::default(),
                classifier: RetryOnError,
                hook: (),
            },
        }
    }
}

impl Default for RetryLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl<C, H> RetryLayer<C, H> {
    /// The most calls per operation, the first included. Default 4.
    ///
    /// # Panics
    ///
    /// If `attempts` is zero.
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        assert!(attempts > 0, "RetryLayer::max_attempts must be at least 1");
        self.config.settings.max_attempts = attempts;
        self
    }

    /// The backoff between attempts.
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.config.settings.backoff = backoff;
        self
    }

    /// The longest wait a server's `Retry-After` or pushback can impose. Default 60 s.
    pub fn retry_after_cap(mut self, cap: Duration) -> Self {
        self.config.settings.retry_after_cap = cap;
        self
    }

    /// The budget for a whole operation: every attempt and every wait. Default 30 s. A deadline
    /// already in scope (an outer layer's, or the caller's) wins when it is sooner.
    ///
    /// # Panics
    ///
    /// If `deadline` is zero.
    pub fn deadline(mut self, deadline: Duration) -> Self {
        assert!(!deadline.is_zero(), "RetryLayer::deadline must not be zero");
        self.config.settings.deadline = deadline;
        self
    }

    /// The retry budget, shared by every clone of this layer (and of its services).
    pub fn budget(mut self, budget: RetryBudget) -> Self {
        self.config.settings.budget = Some(budget);
        self
    }

    /// No retry budget: only the attempt limit and the deadline bound retries.
    pub fn no_budget(mut self) -> Self {
        self.config.settings.budget = None;
        self
    }

    /// Seeds the jitter's random numbers, making every delay reproducible (for tests and demos).
    pub fn rng_seed(mut self, seed: u64) -> Self {
        self.config.settings.rng = Some(Arc::new(Mutex::new(fastrand::Rng::with_seed(seed))));
        self
    }

    /// How outcomes are classified: see [`classify`](crate::classify).
    pub fn classify<C2>(self, classifier: C2) -> RetryLayer<C2, H> {
        let mut c = self.config;
        c.settings.classifier_set = true;
        RetryLayer {
            config: Config {
                settings: c.settings,
                classifier,
                hook: c.hook,
            },
        }
    }

    /// Called before each retry's wait: see [`OnRetry`](crate::hook::OnRetry).
    pub fn on_retry<H2>(self, hook: H2) -> RetryLayer<C, H2> {
        let c = self.config;
        RetryLayer {
            config: Config {
                settings: c.settings,
                hook,
                classifier: c.classifier,
            },
        }
    }

    /// The counters of this layer and every service it made.
    pub fn stats(&self) -> StatsSnapshot {
        self.config.settings.stats.snapshot()
    }

    pub(crate) fn config(&self) -> &Config<C, H> {
        &self.config
    }
}

impl<S, C: Clone, H: Clone> Layer<S> for RetryLayer<C, H> {
    type Service = Retry<S, C, H>;

    fn layer(&self, inner: S) -> Self::Service {
        Retry::new(inner, PerThread::new(self.config.clone()))
    }
}

impl<C, H> fmt::Debug for RetryLayer<C, H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryLayer")
            .field("config", &self.config)
            .finish()
    }
}
