//! A circuit breaker for tower: fail fast while a dependency is failing, probe it after a
//! break, let traffic through again once it answers.
//!
//! A dependency that is down turns every call into a slow failure and every retry into more
//! load on it; a worker pool saturates retrying work that cannot succeed. [`CircuitBreakerLayer`]
//! watches the outcomes of the calls it lets through and, once too many fail, **opens**: calls
//! are refused at once, without being sent, with a typed error ([`BreakerError::is_circuit_open`]) that
//! says how long until the circuit admits a probe ([`CircuitOpen::retry_after`]). After the
//! break it is **half-open**: a bounded number of probes go through; their success closes it,
//! a failure opens it again for a longer break.
//!
//! It speaks the vocabulary of the other tower-once layers:
//!
//! - **one classifier**: outcomes are classified with the same [`Classify`] as the retry layer's
//!   ([`RetryOnError`](tower_once_core::classify::RetryOnError) by default,
//!   [`HttpClassifier`](tower_once_core::classify::HttpClassifier) for HTTP): what the retry
//!   layer would retry is a failure, a success is a success, and the caller's own fault (a
//!   `400`, `404`, `422`) is neither;
//! - **the retry layer understands a refusal**: a `RetryLayer` above waits until the circuit
//!   admits a probe instead of its own backoff, when that fits before its deadline, and gives
//!   up at once otherwise (`GiveUp::CircuitOpen`); it draws nothing from the retry budget for
//!   it, for nothing was sent;
//! - **the fallback and the worker too**: a refused call certainly did not run
//!   ([`Unsent`](tower_once_core::unsent::Unsent)), so a fallback may send it anywhere; the
//!   worker leaves a refused job for redelivery, and with
//!   [`gate_readiness`](CircuitBreakerLayer::gate_readiness) stops fetching jobs while the
//!   circuit is open.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use tower::{Service, ServiceBuilder, ServiceExt};
//! use tower_once_breaker::CircuitBreakerLayer;
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let mut svc = ServiceBuilder::new()
//!     .layer(CircuitBreakerLayer::new().consecutive_failures(3))
//!     .service_fn(|_: &'static str| async { Err::<(), _>("connection reset") });
//! for _ in 0..3 {
//!     let err = svc.ready().await.unwrap().call("charge").await.unwrap_err();
//!     assert!(!err.is_circuit_open(), "sent, and failed");
//! }
//! let err = svc.ready().await.unwrap().call("charge").await.unwrap_err();
//! assert!(err.is_circuit_open(), "refused without being sent");
//! assert!(err.circuit_retry_after().unwrap() <= Duration::from_secs(5));
//! # }
//! ```
//!
//! # Semantics
//!
//! | state | a call | moves to |
//! |---|---|---|
//! | closed | goes through; its outcome is counted | open, when the trip condition holds after a failure |
//! | open | refused: [`CircuitOpen`] with the time left in the break | half-open, when the first call after the break arrives (it is the first probe) |
//! | half-open | goes through as a probe while fewer than [`half_open_probes`](CircuitBreakerLayer::half_open_probes) are in flight; otherwise refused | closed when that many probes succeeded; open (a longer break) when one fails, or when no decision came within [`max_half_open_wait`](CircuitBreakerLayer::max_half_open_wait) |
//! | isolated (by hand) | refused | closed, by hand |
//!
//! | the outcome classifies as | in the closed state | for a probe |
//! |---|---|---|
//! | `Success`, in less than [`slow_call`](CircuitBreakerLayer::slow_call) | a success | a success |
//! | `Success`, but slow | a failure | a failure |
//! | `Retry` (a transport error, a `TimeoutLayer` expiry, a `5xx`, `429`) | a failure | a failure |
//! | `Stop` (the caller's fault), `InProgress` (an idempotency server still running it) | neither | neither: its place is given back |
//! | the caller dropped the call | nothing | nothing: its place is given back |
//!
//! The trip condition is a failure ratio over a sliding window with a minimum throughput
//! ([`failure_ratio`](CircuitBreakerLayer::failure_ratio), the default: half of at least 20
//! calls in 30 s), or failures in a row
//! ([`consecutive_failures`](CircuitBreakerLayer::consecutive_failures)). Breaks back off:
//! the `n`th trip in a row waits the `n`th delay of
//! [`break_duration`](CircuitBreakerLayer::break_duration) (5 s doubling to 60 s, jittered,
//! by default), so a dependency that keeps failing its probes is probed less and less often.
//! Outcomes of calls let through before a transition are not counted after it.
//!
//! # Placement: inside or outside a retry
//!
//! | stack | what a circuit counts | use it for |
//! |---|---|---|
//! | `RetryLayer` → `CircuitBreakerLayer` → transport (Microsoft's standard order) | each operation once, by its first attempt (retries of it are not counted, unless [`count_every_attempt`](CircuitBreakerLayer::count_every_attempt)); every probe | an HTTP or LLM client: retries wait for the circuit, or give up at once |
//! | `CircuitBreakerLayer` → `RetryLayer` → transport | each operation's final outcome | a job handler: one verdict per job |
//!
//! Counting each operation once is the default because an operation's retries are not
//! independent samples of the dependency's health: one request failing its four attempts is
//! one failure, and a circuit that counted four would trip inside that request's own retry
//! loop (the complaint users of other breakers make). The retry's mark travels with the
//! request (`http::Request`, `tonic::Request`, the worker's `Job`) and in scope, so this holds
//! behind a `tower::buffer::Buffer` and across a spawned task for those types; a plain request
//! type (`String`) behind a spawned task is counted every attempt.
//!
//! # Readiness
//!
//! By default `poll_ready` is the inner service's: an open circuit refuses at `call`. With
//! [`gate_readiness`](CircuitBreakerLayer::gate_readiness), the service is not ready while its
//! default circuit is open, and a half-open circuit's probe is reserved at `poll_ready`: a
//! `Worker` then fetches only as many jobs as it may run, and a balancer routes around the
//! endpoint. A reserved admission holds only while the circuit stays in the same period (one
//! reserved while closed does not pass a circuit that opened since). A gated service never
//! holds a caller past the deadline in scope (a `RetryLayer` polls readiness inside its
//! operation's deadline; a worker inside the job's): when the break ends after it, the service
//! is ready at once and the call is refused, so the retry layer gives up at once. The HTTP
//! retry layer asks for readiness before its operation (and deadline) begins: in front of it,
//! leave the gate off.
//!
//! # Per-key circuits
//!
//! [`CircuitBreakerLayer::http`] keeps one circuit per scheme and authority; any closure can
//! key circuits ([`key`]). The number of keyed circuits is bounded
//! ([`max_circuits`](CircuitBreakerLayer::max_circuits)); see the [`key`] module.
//!
//! # Watching and steering
//!
//! [`CircuitBreakerLayer::circuits`] reads each circuit's state and isolates, closes or
//! resets it by hand; [`on_state_change`](CircuitBreakerLayer::on_state_change) is called on
//! every transition; each transition is a `tracing` event (`circuit`, `from`, `to`, `reason`;
//! `open_ms` when it opens, at `WARN`) and every refusal a `DEBUG` one (`circuit`, `state`).
//!
//! # Cost
//!
//! In the closed state a call loads one word, counts its outcome on its own thread's shard of
//! the window (one clock reading in ratio mode, none with consecutive failures) and allocates
//! nothing: no lock, and no atomic another core writes. A keyed circuit adds a lookup in the
//! thread's own cache of circuits.
//!
//! # Differences from tower-resilience's circuit breaker
//!
//! Its count window is a running count since the last transition, and its time window keeps
//! one record per call; its half-open probes have no time limit (a hung probe keeps it
//! half-open). Here the window slides in buckets, a half-open circuit decides within
//! [`max_half_open_wait`](CircuitBreakerLayer::max_half_open_wait), breaks back off, circuits can be
//! keyed, and the retry layer, fallback and worker understand a refusal.
//!
//! # Feature flags
//!
//! | feature | enables |
//! |---|---|
//! | `metrics` | `tower_once_breaker_transitions_total{to}`, `tower_once_breaker_refusals_total{state}`, the gauges `tower_once_breaker_state{circuit}` (0 closed, 1 open, 2 half-open, 3 isolated) and `tower_once_breaker_circuits` (keyed circuits held), through the `metrics` facade |
//!
//! # Minimum supported Rust version
//!
//! 1.88. Raising it is a minor-version change.

// Feature-gated items show their feature on docs.rs.
#![cfg_attr(docsrs, feature(doc_cfg))]
// Library code never unwraps: a panic on input is a bug (tests may).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod circuit;
mod config;
mod error;
mod future;
mod guard;
mod handle;
pub mod hook;
pub mod key;
mod layer;
mod metrics;
mod registry;
mod service;

pub use self::error::{BreakerError, CircuitOpen};
pub use self::future::ResponseFuture;
pub use self::handle::{CircuitHandle, Circuits};
pub use self::layer::CircuitBreakerLayer;
pub use self::service::CircuitBreaker;
pub use tower_once_core::classify::Classify;

/// The state of a circuit. See the [crate docs](crate).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CircuitState {
    /// Calls go through and are counted.
    Closed,
    /// Calls are refused until the break ends.
    Open,
    /// A bounded number of probes go through; the rest are refused.
    HalfOpen,
    /// Opened by hand: calls are refused until it is closed by hand.
    Isolated,
}

impl CircuitState {
    /// A stable lowercase name: `closed`, `open`, `half_open`, `isolated`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Closed => "closed",
            Self::Open => "open",
            Self::HalfOpen => "half_open",
            Self::Isolated => "isolated",
        }
    }

    /// The number the `tower_once_breaker_state` gauge shows.
    pub const fn code(self) -> u8 {
        match self {
            Self::Closed => 0,
            Self::Open => 1,
            Self::HalfOpen => 2,
            Self::Isolated => 3,
        }
    }
}

impl std::fmt::Display for CircuitState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::HalfOpen => "half-open",
            other => other.as_str(),
        })
    }
}
