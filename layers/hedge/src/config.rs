//! The settings of one hedging layer, shared by its services and their futures.

use crate::latency::Latency;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tower_once_core::budget::RetryBudget;

use crate::hook::OnHedge;

/// When to send a hedge.
#[derive(Debug, Clone)]
pub(crate) enum When {
    /// A fixed delay after the call (and after each hedge).
    After(Duration),
    /// A percentile of the latencies observed in the last period.
    Percentile(Arc<Latency>),
}

impl When {
    /// The delay before the next hedge, if one may be sent at all.
    pub(crate) fn delay(&self, now: Instant) -> Option<Duration> {
        match self {
            Self::After(delay) => Some(*delay),
            Self::Percentile(latency) => latency.delay(now),
        }
    }
}

#[derive(Clone)]
pub(crate) struct Config<S, C> {
    /// The inner service, cloned when a hedge is sent.
    pub(crate) service: S,
    pub(crate) when: When,
    pub(crate) max_hedges: u32,
    pub(crate) budget: Option<RetryBudget>,
    pub(crate) classifier: C,
    pub(crate) hook: Option<Arc<dyn OnHedge>>,
}

impl<S, C> fmt::Debug for Config<S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("when", &self.when)
            .field("max_hedges", &self.max_hedges)
            .field("budget", &self.budget)
            .field("classifier", &std::any::type_name::<C>())
            .field("hook", &self.hook.is_some())
            .finish_non_exhaustive()
    }
}
