//! The settings of one retry layer and their defaults, shared by the layers (generic and HTTP),
//! the services and the futures.

use crate::backoff::Backoff;
use crate::budget::RetryBudget;
use crate::hook::Stats;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tower_once_core::shard::Padded;

/// What a response future holds of its layer: its thread's copy of the config (see
/// [`PerThread`](tower_once_core::shard::PerThread)).
pub(crate) type SharedConfig<C, H> = Arc<Padded<Config<C, H>>>;

#[derive(Clone)]
pub(crate) struct Config<C, H> {
    pub(crate) settings: Settings,
    pub(crate) classifier: C,
    pub(crate) hook: H,
}

#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) max_attempts: u32,
    pub(crate) backoff: Backoff,
    pub(crate) retry_after_cap: Duration,
    pub(crate) deadline: Duration,
    pub(crate) budget: Option<RetryBudget>,
    pub(crate) rng: Option<Arc<Mutex<fastrand::Rng>>>,
    pub(crate) stats: Arc<Stats>,
    // Whether `classify` was called: the HTTP form then keeps the chosen classifier instead of
    // classifying HTTP responses by default.
    pub(crate) classifier_set: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            max_attempts: 4,
            backoff: Backoff::default(),
            retry_after_cap: Duration::from_secs(60),
            deadline: Duration::from_secs(30),
            budget: Some(RetryBudget::default()),
            rng: None,
            stats: Arc::default(),
            classifier_set: false,
        }
    }
}

impl<C, H> fmt::Debug for Config<C, H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("settings", &self.settings)
            .field("classifier", &std::any::type_name::<C>())
            .field("hook", &std::any::type_name::<H>())
            .finish()
    }
}
