use crate::circuit::word::MAX_PROBES;
use crate::config::{Settings, Trip};
use crate::handle::Circuits;
use crate::hook::OnStateChange;
use crate::key::Authority;
use crate::registry::Config;
use crate::registry::Registry;
use crate::service::CircuitBreaker;
use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tower_layer::Layer;
use tower_once_core::backoff::Backoff;
use tower_once_core::classify::{HttpClassifier, RetryOnError};
use tower_once_core::shard::PerThread;

/// Fails calls fast while their dependency is failing, probes it after a break, and lets
/// traffic through again once it answers. See the [crate docs](crate).
///
/// Settings come first: the circuits are made when the layer first makes a service (or
/// [`circuits`](Self::circuits) is called), and every clone of the layer, and every service
/// made from it, shares them. A setting changed after that starts a fresh set of circuits.
///
/// ```
/// use std::time::Duration;
/// use tower_once_breaker::CircuitBreakerLayer;
///
/// // Open after 5 failures in a row; by default: half the calls of the last 30 s failing,
/// // with at least 20 calls.
/// let layer = CircuitBreakerLayer::new()
///     .consecutive_failures(5)
///     .slow_call(Duration::from_secs(2))
///     .half_open_probes(2);
/// # let _ = layer;
/// ```
#[derive(Clone)]
pub struct CircuitBreakerLayer<K = (), C = RetryOnError> {
    settings: Settings,
    key: K,
    classifier: C,
    registry: Arc<OnceLock<Arc<Registry>>>,
}

impl CircuitBreakerLayer {
    /// One circuit for the layer, with [`RetryOnError`]: every `Err` is a failure. It opens
    /// when half the calls of the last 30 s failed, counting at least 20 calls; its first
    /// break is 2.5 to 5 s, doubling on each trip in a row up to 60 s; one probe at a time
    /// decides; a half-open circuit gets 60 s to decide before it opens again.
    pub fn new() -> Self {
        Self {
            settings: Settings::default(),
            key: (),
            classifier: RetryOnError,
            registry: Arc::default(),
        }
    }
}

impl CircuitBreakerLayer<Authority, HttpClassifier> {
    /// For HTTP and gRPC clients: [`HttpClassifier`] (transport errors, `5xx`, `429`, `408`
    /// and gRPC `UNAVAILABLE` are failures; other `4xx` are the caller's and count as
    /// neither) and one circuit per scheme and authority ([`Authority`]); otherwise as
    /// [`new`](CircuitBreakerLayer::new).
    pub fn http() -> Self {
        CircuitBreakerLayer::new()
            .classify(HttpClassifier)
            .key_by(Authority)
    }
}

impl Default for CircuitBreakerLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl<K, C> CircuitBreakerLayer<K, C> {
    fn set(mut self, f: impl FnOnce(&mut Settings)) -> Self {
        f(&mut self.settings);
        self.registry = Arc::default();
        self
    }

    /// Opens a closed circuit when at least `ratio` of the calls of the last `window` failed
    /// and there were at least `min_throughput` of them (Polly's and Microsoft's failure ratio
    /// with minimum throughput). The default: 0.5, 20, 30 s.
    ///
    /// # Panics
    ///
    /// If `ratio` is not in `(0, 1]`, `min_throughput` is zero, or `window` is shorter than
    /// 10 ms.
    pub fn failure_ratio(self, ratio: f64, min_throughput: u32, window: Duration) -> Self {
        assert!(
            ratio > 0.0 && ratio <= 1.0,
            "CircuitBreakerLayer::failure_ratio: the ratio must be in (0, 1]"
        );
        assert!(
            min_throughput > 0,
            "CircuitBreakerLayer::failure_ratio: min_throughput must be at least 1"
        );
        assert!(
            window >= Duration::from_millis(10),
            "CircuitBreakerLayer::failure_ratio: the window must be at least 10 ms"
        );
        self.set(|s| {
            s.trip = Trip::Ratio {
                ratio,
                min_throughput,
                window,
            }
        })
    }

    /// Opens a closed circuit after `failures` failures in a row, instead of a failure ratio.
    ///
    /// # Panics
    ///
    /// If `failures` is zero.
    pub fn consecutive_failures(self, failures: u32) -> Self {
        assert!(
            failures > 0,
            "CircuitBreakerLayer::consecutive_failures must be at least 1"
        );
        self.set(|s| s.trip = Trip::Consecutive(failures))
    }

    /// How long a circuit stays open: the `n`th trip in a row (without a successful probe in
    /// between) waits `backoff`'s `n`th delay, jitter included. The default: 5 s doubling to
    /// 60 s, equal jitter (each break between half and all of that).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_once_breaker::CircuitBreakerLayer;
    /// use tower_once_core::backoff::{Backoff, Jitter};
    ///
    /// // Always 30 s, as resilience4j's default.
    /// let fixed = Backoff::new(Duration::from_secs(30), 1.0, Duration::from_secs(30))
    ///     .unwrap()
    ///     .jitter(Jitter::None);
    /// let layer = CircuitBreakerLayer::new().break_duration(fixed);
    /// # let _ = layer;
    /// ```
    pub fn break_duration(self, backoff: Backoff) -> Self {
        self.set(|s| s.breaks = backoff)
    }

    /// How many probes a half-open circuit lets through at once; that many successes close
    /// it, and one failure opens it again. Default 1.
    ///
    /// # Panics
    ///
    /// If `probes` is zero or above 65 535.
    pub fn half_open_probes(self, probes: u32) -> Self {
        assert!(
            (1..=MAX_PROBES).contains(&probes),
            "CircuitBreakerLayer::half_open_probes must be in 1..=65535"
        );
        self.set(|s| s.probes = probes)
    }

    /// The longest a circuit stays half-open without a decision (its probes hang, or nobody
    /// calls) before it opens again, as resilience4j's `maxWaitDurationInHalfOpenState`.
    /// Default 60 s.
    ///
    /// # Panics
    ///
    /// If `wait` is zero.
    pub fn max_half_open_wait(self, wait: Duration) -> Self {
        assert!(
            !wait.is_zero(),
            "CircuitBreakerLayer::max_half_open_wait must not be zero"
        );
        self.set(|s| s.max_half_open_wait = wait)
    }

    /// Successful calls that took `threshold` or longer count as failures: a dependency that
    /// answers, but too slowly to be of use, is failing. Off by default.
    pub fn slow_call(self, threshold: Duration) -> Self {
        self.set(|s| s.slow_call = Some(threshold))
    }

    /// Whether a closed circuit counts every attempt of an operation a `RetryLayer` above
    /// retries. Default `false`: it counts each operation once, by its first attempt, so one
    /// request failing its four attempts is one failure, not four (and cannot trip the
    /// circuit inside its own retry loop). Probes always count.
    pub fn count_every_attempt(self, every: bool) -> Self {
        self.set(|s| s.every_attempt = every)
    }

    /// The most circuits with keys of their own. Default 1 024. Past it, a new key evicts an
    /// idle circuit (closed, no failure counted, no call for a minute), or shares one overflow
    /// circuit: a stream of hostile keys cannot grow memory, nor reset a sick endpoint's
    /// circuit. Each circuit takes about 2 KiB.
    ///
    /// # Panics
    ///
    /// If `max` is zero.
    pub fn max_circuits(self, max: usize) -> Self {
        assert!(
            max > 0,
            "CircuitBreakerLayer::max_circuits must be at least 1"
        );
        self.set(|s| s.max_circuits = max)
    }

    /// Whether the service is not ready while its default circuit is open: `poll_ready`
    /// waits for the break to end (a half-open circuit reserves a probe for the next call).
    /// A `Worker` then stops fetching jobs, and a balancer routes around the endpoint, instead
    /// of having calls refused. Keyed circuits are only known at `call`, so they always
    /// refuse. Default `false`.
    pub fn gate_readiness(self, gate: bool) -> Self {
        self.set(|s| s.gate = gate)
    }

    /// Seeds the breaks' jitter, making every break reproducible (for tests and demos).
    pub fn rng_seed(self, seed: u64) -> Self {
        self.set(|s| s.seed = Some(seed))
    }

    /// Calls `hook` on every state change of every circuit, by the call that made it
    /// ([`OnStateChange`]: a closure, or `()` for none).
    ///
    /// ```
    /// use tower_once_breaker::{hook::StateChange, CircuitBreakerLayer};
    ///
    /// let layer = CircuitBreakerLayer::new().on_state_change(|change: &StateChange<'_>| {
    ///     eprintln!("{:?}: {} -> {} ({})", change.circuit, change.from, change.to, change.cause);
    /// });
    /// # let _ = layer;
    /// ```
    pub fn on_state_change(self, hook: impl OnStateChange) -> Self {
        self.set(|s| s.on_change = Some(Arc::new(hook)))
    }

    /// How outcomes are classified, in the vocabulary every tower-once layer shares: `Retry`
    /// is a failure, `Success` a success, `Stop` and `InProgress` neither.
    pub fn classify<C2>(self, classifier: C2) -> CircuitBreakerLayer<K, C2> {
        CircuitBreakerLayer {
            settings: self.settings,
            key: self.key,
            classifier,
            registry: Arc::default(),
        }
    }

    /// Which circuit each request goes through: see [`key`](crate::key).
    pub fn key_by<K2>(self, key: K2) -> CircuitBreakerLayer<K2, C> {
        CircuitBreakerLayer {
            settings: self.settings,
            key,
            classifier: self.classifier,
            registry: Arc::default(),
        }
    }

    /// The circuits of this layer and of every service it made, to read and steer by hand.
    pub fn circuits(&self) -> Circuits {
        Circuits {
            registry: self.registry().clone(),
        }
    }

    fn registry(&self) -> &Arc<Registry> {
        self.registry
            .get_or_init(|| Arc::new(Registry::new(self.settings.policy())))
    }
}

impl<S, K: Clone, C: Clone> Layer<S> for CircuitBreakerLayer<K, C> {
    type Service = CircuitBreaker<S, K, C>;

    fn layer(&self, inner: S) -> Self::Service {
        CircuitBreaker::new(
            inner,
            PerThread::new(Config {
                key: self.key.clone(),
                classifier: self.classifier.clone(),
                registry: self.registry().clone(),
            }),
            self.settings.gate,
        )
    }
}

impl<K, C> fmt::Debug for CircuitBreakerLayer<K, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CircuitBreakerLayer")
            .field("settings", &self.settings)
            .field("key", &std::any::type_name::<K>())
            .field("classifier", &std::any::type_name::<C>())
            .finish()
    }
}
