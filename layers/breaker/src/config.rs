//! The settings of one breaker layer and their defaults, shared by the layer, its services,
//! their futures and every circuit.

use crate::hook::OnStateChange;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;
use tower_once_core::backoff::{Backoff, Jitter};

/// The state-change hook, shared by every circuit of a layer.
pub(crate) type OnChange = Arc<dyn OnStateChange>;

/// When a closed circuit opens.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Trip {
    /// `ratio` of the calls in the last `window` failed, and there were at least
    /// `min_throughput` of them.
    Ratio {
        ratio: f64,
        min_throughput: u32,
        window: Duration,
    },
    /// `n` failures in a row.
    Consecutive(u32),
}

/// What every circuit of a layer follows: the layer's settings, with what they make.
pub(crate) struct Policy {
    settings: Settings,
    /// A seeded generator for the breaks' jitter (tests); `None`: fastrand's thread-local one.
    pub(crate) rng: Option<Mutex<fastrand::Rng>>,
    /// Every circuit's clock starts here.
    pub(crate) origin: Instant,
}

impl std::ops::Deref for Policy {
    type Target = Settings;

    fn deref(&self) -> &Settings {
        &self.settings
    }
}

/// The settings of a layer.
#[derive(Clone)]
pub(crate) struct Settings {
    /// When a closed circuit opens.
    pub(crate) trip: Trip,
    /// How long a circuit stays open: the `n`th trip in a row waits `breaks.delay(n)`.
    pub(crate) breaks: Backoff,
    /// Probes a half-open circuit admits at once; that many successes close it.
    pub(crate) probes: u32,
    /// The longest a circuit stays half-open without a decision before it opens again.
    pub(crate) max_half_open_wait: Duration,
    /// Successful calls slower than this count as failures.
    pub(crate) slow_call: Option<Duration>,
    /// Count every attempt of a retried operation, not only its first.
    pub(crate) every_attempt: bool,
    /// The most circuits with keys of their own.
    pub(crate) max_circuits: usize,
    pub(crate) gate: bool,
    pub(crate) seed: Option<u64>,
    pub(crate) on_change: Option<OnChange>,
}

/// The default break: 5 s, doubling on each trip in a row up to 60 s, each drawn between half
/// and all of that (equal jitter), so that clients that tripped together probe apart.
pub(crate) fn default_breaks() -> Backoff {
    match Backoff::new(Duration::from_secs(5), 2.0, Duration::from_secs(60)) {
        Ok(backoff) => backoff.jitter(Jitter::Equal),
        Err(_) => Backoff::default(),
    }
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            trip: Trip::Ratio {
                ratio: 0.5,
                min_throughput: 20,
                window: Duration::from_secs(30),
            },
            breaks: default_breaks(),
            probes: 1,
            max_half_open_wait: Duration::from_secs(60),
            slow_call: None,
            every_attempt: false,
            max_circuits: 1024,
            gate: false,
            seed: None,
            on_change: None,
        }
    }
}

impl Settings {
    pub(crate) fn policy(&self) -> Policy {
        Policy {
            settings: self.clone(),
            rng: self
                .seed
                .map(|seed| Mutex::new(fastrand::Rng::with_seed(seed))),
            origin: Instant::now(),
        }
    }
}

impl fmt::Debug for Settings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Settings")
            .field("trip", &self.trip)
            .field("breaks", &self.breaks)
            .field("probes", &self.probes)
            .field("max_half_open_wait", &self.max_half_open_wait)
            .field("slow_call", &self.slow_call)
            .field("every_attempt", &self.every_attempt)
            .field("max_circuits", &self.max_circuits)
            .field("gate", &self.gate)
            .field("seed", &self.seed)
            .field(
                "on_change",
                &self.on_change.as_ref().map(|_| "OnStateChange"),
            )
            .finish()
    }
}

impl fmt::Debug for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Policy")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}
