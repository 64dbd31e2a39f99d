//! Tower layers that make retries safe: exactly-once *effects* over at-least-once networks.
//!
//! Networks deliver at least once: clients retry, queues redeliver, and a timeout never tells
//! whether the work happened. `tower-once` gives tower, axum, tonic and hyper users drop-in
//! [`tower::Layer`](https://docs.rs/tower/latest/tower/trait.Layer.html)s so a request's effect
//! happens once:
//!
//! - [`idempotency`]: the server side. [`IdempotencyLayer`](idempotency::IdempotencyLayer) reads
//!   the `Idempotency-Key` header, runs the handler once per key and replays the stored response
//!   to retries.
//! - [`timeout`] (feature `timeout`): per-call caps that respect the remaining operation
//!   [`Deadline`](timeout::Deadline), for any service, HTTP clients and servers, with
//!   `grpc-timeout` in both directions.
//! - [`retry`] (feature `retry`): classified retries with jittered backoff, `Retry-After`, one
//!   deadline across attempts and a shared retry budget, for any service whose requests are
//!   `Clone`; its HTTP form replays non-`Clone` bodies, retries only safe requests and stamps
//!   idempotency keys. The layer ends an operation at its deadline whatever sits below it.
//! - [`breaker`] (feature `breaker`): a circuit breaker on the same classifier: fail fast
//!   while a dependency is failing, probe it after a backed-off break, one circuit per host;
//!   the retry layer waits for its probe or gives up at once, and a worker stops fetching.
//! - [`fallback`] (feature `fallback`): send a failed request to a secondary service only
//!   when that cannot repeat its effect: it certainly did not run, it is idempotent or
//!   side-effect free, or the secondary shares the primary's idempotency records.
//! - [`hedge`] (feature `hedge`): send a copy of a slow request and take the first good
//!   answer, only for requests safe to run twice (a `POST` gets one idempotency key on every
//!   copy); hedges and retries share one budget.
//! - [`worker`] (feature `worker`): a Redis Streams worker whose job handler is a
//!   `tower::Service<Job>`: redelivery after crashes, dead letters, run-once per job id.
//! - [`outbox`] (feature `outbox`): a transactional outbox on Postgres (sqlx) whose relay sends
//!   through a `tower::Service<OutboxMessage>` with the dedupe key as the idempotency key;
//!   `outbox::http::HttpSender` is a ready-made one for HTTP providers.
//! - [`core`]: what the layers share, for code of your own: the classifier vocabulary,
//!   `Unsent` (implement it for an error type of yours to put it behind a fallback), `Carrier`,
//!   `SafeToRetry`.
//! - [`shutdown_signal`] (feature `signal`): the future a server, worker or relay waits on to
//!   stop gracefully: SIGTERM (what containers are stopped with) or SIGINT on unix.
//!
//! # Example
//!
//! ```no_run
//! use axum::{routing::post, Router};
//! use tower_once::idempotency::IdempotencyLayer;
//!
//! # #[tokio::main]
//! # async fn main() -> std::io::Result<()> {
//! let app = Router::new()
//!     .route("/charges", post(|| async { (http::StatusCode::CREATED, "charged") }))
//!     .layer(IdempotencyLayer::new().require_key(true));
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//! axum::serve(listener, app).await
//! # }
//! ```
//!
//! The rest of this page: [recommended stacks](#recommended-stacks) for servers, HTTP and LLM
//! clients and job handlers, each as code; [what to do when a stack does not
//! compile](#when-a-stack-does-not-compile); how the [circuit breaker, fallback and
//! hedging](#client-protection-circuit-breaker-fallback-hedging) work with the retry layer;
//! [feature flags](#feature-flags); [metrics](#metrics).
//!
#![doc = include_str!("../docs/recommended_stacks.md")]
//!
#![doc = include_str!("../docs/client_protection.md")]
//!
//! # Feature flags
//!
//! | feature       | default | enables |
//! |---------------|---------|---------|
//! | `idempotency` | yes     | [`idempotency`]: `IdempotencyLayer` and the in-memory store |
//! | `axum`        | yes     | nothing of its own: records follow the path the client addressed behind axum's `Router::nest` in every build (axum's `OriginalUri`) |
//! | `retry`       | yes     | [`retry`]: `RetryLayer`, backoff, budget, classifiers (enables `timeout`) |
//! | `timeout`     | yes     | [`timeout`]: `TimeoutLayer`, `HttpTimeoutLayer`, `ServerTimeoutLayer`, `Deadline` |
//! | `breaker`     | yes     | [`breaker`]: `CircuitBreakerLayer`, per-key circuits |
//! | `fallback`    | yes     | [`fallback`]: `FallbackLayer`, `HttpFallbackLayer` (enables `timeout`) |
//! | `hedge`       | yes     | [`hedge`]: `HedgeLayer`, `HttpHedgeLayer` (enables `retry`) |
//! | `signal`      | yes     | [`shutdown_signal`]: SIGTERM or SIGINT (Ctrl-C off unix) as a shutdown future (tokio's `signal` feature) |
//! | `redis`       | no      | `idempotency::store::redis`: the Redis / Redis Cluster store |
//! | `worker`      | no      | [`worker`]: the Redis Streams worker, producer, dead letters and `RunOnceLayer` (enables `retry`, `timeout`, `redis`, `signal`) |
//! | `outbox`      | no      | [`outbox`]: the Postgres outbox, its relay and the HTTP sender `outbox::http` (enables `retry`, `timeout`, `signal`) |
//! | `metrics`     | no      | counters and histograms through the `metrics` facade (below) |
//! | `reqwest`     | no      | `retry::reqwest`: a `reqwest::Client` as a tower service; `send_with` for requests built the reqwest way |
//! | `tonic`       | no      | `retry::tonic`: adapters for tonic clients (a `Channel` below, `tonic::Status` errors above) |
//! | `full`        | no      | all of the above |
//!
//! # Metrics
//!
//! Every layer emits `tracing` spans and events (the idempotency layer's span is `idempotency`
//! with the fields `method`, `path`, `store_key` and `outcome`; the worker's is `job` with
//! `job_id`, `stream_id`, `deliveries` and `outcome`). With the `metrics` feature, each enabled
//! layer also reports through the [`metrics`](https://docs.rs/metrics) facade, to whichever
//! recorder the application installs (Prometheus, StatsD, ...), under these stable names
//! (the repository's `tests/metrics.rs` records them; `tests/docs.rs` checks this table against
//! the names the layers register):
//!
//! | metric | type | labels | counts |
//! |---|---|---|---|
//! | `tower_once_idempotency_requests_total` | counter | `outcome`: `stored`, `released`, `replayed`, `conflict`, `mismatch`, `rejected`, `not_replayable`, `unavailable`, `unclaimed` | covered requests, by how they ended |
//! | `tower_once_retry_operations_total` | counter | | logical operations (first attempts) |
//! | `tower_once_retry_attempts_total` | counter | | calls of the inner service |
//! | `tower_once_retry_retries_total` | counter | | retries (waits started) |
//! | `tower_once_retry_delay_seconds` | histogram | | the wait before each retry |
//! | `tower_once_retry_budget_refusals_total` | counter | | retries the budget refused |
//! | `tower_once_retry_give_ups_total` | counter | `reason`: `exhausted`, `deadline`, `budget`, `circuit_open` | operations that ended on a retryable outcome |
//! | `tower_once_breaker_transitions_total` | counter | `to`: `closed`, `open`, `half_open`, `isolated` | circuit state changes |
//! | `tower_once_breaker_refusals_total` | counter | `state`: `open`, `half_open`, `isolated` | calls a circuit refused |
//! | `tower_once_breaker_state` | gauge | `circuit` | each circuit's state: 0 closed, 1 open, 2 half-open, 3 isolated |
//! | `tower_once_breaker_circuits` | gauge | | keyed circuits held |
//! | `tower_once_fallback_fallbacks_total` | counter | `reason`: `unsent`, `idempotent`, `side_effect_free`, `shared_records` | requests sent to the secondary |
//! | `tower_once_fallback_withheld_total` | counter | | failed requests kept from the secondary because they may have run |
//! | `tower_once_hedge_hedges_total` | counter | | hedges sent |
//! | `tower_once_hedge_wins_total` | counter | | operations a hedge answered first |
//! | `tower_once_hedge_budget_refusals_total` | counter | | hedges the retry budget refused |
//! | `tower_once_step_steps_total` | counter | `outcome`: `called`, `replayed`, `unknown`, `mismatch`, `in_progress`, `failed` | steps, by how they ended |
//! | `tower_once_step_waits_total` | counter | | steps that waited for the same step running elsewhere |
//! | `tower_once_timeout_timeouts_total` | counter | `bound`: `limit`, `deadline`; `layer`: `timeout`, `http_body`, `server` | expiries |
//! | `tower_once_worker_processed_total` | counter | | deliveries whose handler succeeded (acknowledged) |
//! | `tower_once_worker_failed_total` | counter | | deliveries whose handler failed or missed its deadline |
//! | `tower_once_worker_redelivered_total` | counter | | deliveries with a delivery count above 1 that reached the handler |
//! | `tower_once_worker_dead_lettered_total` | counter | `reason`: `max_deliveries`, `permanent`, `malformed` | entries moved to the dead-letter stream |
//! | `tower_once_worker_in_flight` | gauge | | handlers running now |
//! | `tower_once_worker_group_lag` | gauge | | entries not yet delivered to the group (`XINFO GROUPS` `lag`, read every `claim_idle / 3`) |
//! | `tower_once_outbox_sends_total` | counter | `outcome`: `sent`, `sent_unrecorded`, `failed`, `parked`, `lease_lost`, `released` | outbox rows the relay tried to send, by outcome |
//!
//! # Minimum supported Rust version
//!
//! 1.88. Raising it is a minor-version change.

// Library code never unwraps: a panic on input is a bug (tests may).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]
#![cfg_attr(docsrs, feature(doc_cfg))]

/// What the layers share: the classification vocabulary (`classify`), the retry attempt's
/// mark (`attempt`), whether a failed call was sent (`unsent`), which requests may be sent
/// again (`resend`), backoff, bodies, error chains.
pub use tower_once_core as core;

#[cfg(feature = "idempotency")]
#[cfg_attr(docsrs, doc(cfg(feature = "idempotency")))]
#[doc(inline)]
pub use tower_once_idempotency as idempotency;

#[cfg(feature = "retry")]
#[cfg_attr(docsrs, doc(cfg(feature = "retry")))]
#[doc(inline)]
pub use tower_once_retry as retry;

#[cfg(feature = "timeout")]
#[cfg_attr(docsrs, doc(cfg(feature = "timeout")))]
#[doc(inline)]
pub use tower_once_timeout as timeout;

#[cfg(feature = "breaker")]
#[cfg_attr(docsrs, doc(cfg(feature = "breaker")))]
#[doc(inline)]
pub use tower_once_breaker as breaker;

#[cfg(feature = "fallback")]
#[cfg_attr(docsrs, doc(cfg(feature = "fallback")))]
#[doc(inline)]
pub use tower_once_fallback as fallback;

#[cfg(feature = "hedge")]
#[cfg_attr(docsrs, doc(cfg(feature = "hedge")))]
#[doc(inline)]
pub use tower_once_hedge as hedge;

#[cfg(feature = "step")]
#[cfg_attr(docsrs, doc(cfg(feature = "step")))]
#[doc(inline)]
pub use tower_once_step as step;

#[cfg(feature = "worker")]
#[cfg_attr(docsrs, doc(cfg(feature = "worker")))]
#[doc(inline)]
pub use tower_once_worker as worker;

#[cfg(feature = "outbox")]
#[cfg_attr(docsrs, doc(cfg(feature = "outbox")))]
#[doc(inline)]
pub use tower_once_outbox as outbox;

#[cfg(feature = "signal")]
mod signal;
#[cfg(feature = "signal")]
#[cfg_attr(docsrs, doc(cfg(feature = "signal")))]
pub use signal::{shutdown_signal, ShutdownSignal};

/// Compiles the README's Rust examples as doctests, so the README cannot drift from the API.
/// They use the default features and no hidden lines (which GitHub would show): the features
/// are named here instead.
#[cfg(all(
    doctest,
    feature = "idempotency",
    feature = "retry",
    feature = "timeout"
))]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
