//! Safe, bounded, storm-proof retries for any tower service.
//!
//! [`RetryLayer`] calls the inner service again when an outcome is transient, and stops when
//! another attempt cannot help or would cost too much:
//!
//! - **Classification** returns an [`Action`](classify::Action): success, retry (optionally
//!   after a delay the server asked for), or stop. [`classify::RetryOnError`] is the default;
//!   [`classify::HttpClassifier`] knows HTTP statuses, `Retry-After` and gRPC status codes.
//! - **Backoff**: exponential with jitter ([`backoff`]); a server's `Retry-After` replaces it
//!   for one wait, capped.
//! - **One deadline** for the whole operation (attempts and waits): the layer's own, or an
//!   earlier one the request carries or the caller has in scope (even one that only comes into
//!   scope while the caller polls, as with `Deadline::in_scope`). No attempt starts and no wait
//!   continues once it has passed: when the next wait would end beyond it, the layer returns
//!   the last outcome at once; an attempt still running when it passes is dropped and the
//!   operation ends with [`RetryError::is_deadline`], whatever sits below; a failure at or
//!   after it (an inner timeout the deadline cut short) is never retried. Each attempt's
//!   `call` (and every poll of its future) runs inside the
//!   [`Deadline`](tower_once_timeout::Deadline)'s scope and carries it on its request, so a
//!   `TimeoutLayer` below caps each attempt at what is left.
//! - **An honest outcome**: when the server says the operation is still running (an
//!   idempotency server's `409` in progress, [`Action::InProgress`](classify::Action)) and the
//!   deadline, the attempts or the budget run out, the operation ends with
//!   [`RetryError::is_in_progress`] and the [key](RetryError::idempotency_key) to fetch the
//!   result later, never with the `409` as if it were the answer.
//! - **A retry budget** shared by every clone of the layer ([`budget`]): a total outage adds
//!   about 20 % load, not four times as much. In a paused-time storm test (10 000 requests over
//!   10 s against an upstream failing every call), the default budget held the load to 12 200
//!   calls (1.22×) where the attempt limit alone allowed 40 000 (4×); with 5 % of calls
//!   failing, all 10 000 requests still succeeded, in 10 513 calls
//!   (`cargo test -p tower-once-retry --test retry -- --nocapture a_retry_storm` prints the
//!   figures).
//! - **Nested layers do not multiply**: a `Retry` called inside another's attempt makes one
//!   attempt and leaves retrying to the outer one.
//! - **A circuit breaker below is heard**: an attempt its circuit refused was never sent; the
//!   layer waits for the circuit's probe instead of its backoff, or gives up at once
//!   ([`RetryError::is_circuit_open`]) when that would be past the deadline.
//!
//! # What crosses a `Buffer` or a spawned task
//!
//! The outer layer marks its attempts in two ways. A thread-local mark (with the deadline's
//! scope) is set while an attempt is called *and while its future is polled*; the layers read
//! it when they are called and when their futures are first polled, so an inner layer reached
//! through an `async` block, a `oneshot` or a `tower::buffer::Buffer` (whose worker hands the
//! inner future back to the caller, who polls it) sees it. Each attempt's request also carries
//! the mark and the [`Deadline`](tower_once_timeout::Deadline) when its type is a
//! [`Carrier`](tower_once_timeout::Carrier) (`http::Request`, `tonic::Request`, the worker's
//! `Job`, the outbox's `OutboxMessage`, or a type of yours), so they travel with it to a
//! spawned task or through a channel.
//!
//! | inner layer reached through | a request that carries them | a request that carries nothing (`String`, `u32`, ...) |
//! |---|---|---|
//! | a direct `call`, an `async` block or `oneshot` in the attempt's future | defers, sees the deadline | defers, sees the deadline |
//! | `tower::buffer::Buffer` | defers, sees the deadline | defers, sees the deadline |
//! | `tokio::spawn`, a channel (the inner future polled on another task) | defers, sees the deadline | **multiplies**, and sees only its own deadline (the outer layer still ends the operation at its deadline) |
//!
//! A generic request type of your own carries nothing until it implements
//! [`Carrier`](tower_once_timeout::Carrier) with extensions of its own. A caller gives a call its
//! deadline with [`Deadline::call`](tower_once_timeout::Deadline::call): the request carries it
//! and the call's future is polled in its scope, so it reaches every layer below, behind a
//! `Buffer` too.
//!
//! # Example
//!
//! ```
//! use std::sync::atomic::{AtomicU32, Ordering};
//! use std::sync::Arc;
//! use std::time::Duration;
//! use tower::{ServiceBuilder, ServiceExt};
//! use tower_once_retry::RetryLayer;
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let calls = Arc::new(AtomicU32::new(0));
//! let counter = calls.clone();
//! let svc = ServiceBuilder::new()
//!     .layer(RetryLayer::new().max_attempts(3))
//!     .service_fn(move |job: &'static str| {
//!         let n = counter.fetch_add(1, Ordering::SeqCst);
//!         async move { if n < 2 { Err("busy") } else { Ok(job) } }
//!     });
//! assert_eq!(svc.oneshot("resize image").await.unwrap(), "resize image");
//! assert_eq!(calls.load(Ordering::SeqCst), 3);
//! # }
//! ```
//!
//! # Semantics
//!
//! | after an attempt | the layer |
//! |---|---|
//! | classified success or stop | returns the outcome (an `Err` as [`RetryError`] with [`GiveUp::NotRetryable`]) |
//! | retry, but the deadline has passed | returns the outcome ([`GiveUp::Deadline`]): a deadline expiry is never retried |
//! | retry, but the attempt limit is reached | returns the outcome ([`GiveUp::Exhausted`]) |
//! | retry, but the wait would end past the deadline | returns the outcome at once ([`GiveUp::Deadline`]) |
//! | retry, but the budget refuses | returns the outcome ([`GiveUp::Budget`]) |
//! | retry, and a circuit breaker below refused the attempt before sending it | waits until the circuit admits a probe, not the backoff, and draws nothing from the budget; when that is past the deadline, returns at once ([`GiveUp::CircuitOpen`], the refusal as the inner error) |
//! | retry | calls the hook, waits, drives the service to readiness, calls it again with a clone of the request |
//! | in progress (the server is still running it) | as retry; when the layer gives up, `Err` with [`RetryError::is_in_progress`] instead of the outcome |
//! | the deadline passes before an attempt could start, during a wait, or during an attempt | `Err` with [`RetryError::is_deadline`] and no inner error |
//!
//! A response that classified as retryable (a `503`, say) is returned as `Ok` when the layer
//! gives up: the caller sees the last real answer. An attempt that the deadline cuts (the layer
//! itself, or a `TimeoutLayer` below at the deadline) ends the operation with
//! [`RetryError::is_deadline`] and [`RetryError::may_have_executed`]: the request was sent, so
//! it may still complete; its text says so, with the attempts, the time taken and the key. [`RetryLayer`] needs `Clone` requests (one
//! clone per attempt); [`http::HttpRetryLayer`] does not.
//!
//! # Differences from tower::retry
//!
//! tower's `Retry` asks a `Policy` for a bool-like decision and leaves backoff, deadlines,
//! `Retry-After` and request cloning to each user; its `TpsBudget` is a separate piece. Here
//! they are one layer with defaults, and the error keeps the inner error's type.
//!
//! What each project documents (checked 2026-11; corrections welcome). "n/d": not documented.
//!
//! | | tower-once | `tower::retry` / `tower::timeout` | tower-http | tower-resilience | reqwest-retry |
//! |---|---|---|---|---|---|
//! | retry classification | action incl. server delay | policy decides | (classify, for tracing) | predicate | transient or not |
//! | `Retry-After` / gRPC pushback | ✓ both | – | – | n/d | separate crate |
//! | one deadline over all attempts | ✓ | – | – | n/d | – |
//! | retry budget | ✓ shared, ratio + floor | ✓ `TpsBudget` | – | ✓ | – |
//! | non-`Clone` request bodies | ✓ buffered up to a limit | clone in the policy | – | `Clone` required | via reqwest |
//! | timeout capped by the deadline | ✓, `grpc-timeout` both ways | fixed | fixed (server, `408`) | fixed | – |
//!
//! # HTTP
//!
//! `http::Request`s are not `Clone`, and their bodies often are not either (hyper's `Incoming`,
//! axum's `Body`, streams). [`http::HttpRetryLayer`] (from [`RetryLayer::into_http`]) buffers
//! the body for replay up to a limit, retries only safe requests (idempotent methods, or a
//! request carrying an `Idempotency-Key`), can stamp a fresh key on unkeyed `POST`/`PATCH`, and
//! puts the operation's deadline in each attempt's extensions. The generic [`RetryLayer`]
//! retries whatever request it is given (an `http::Request<Full<Bytes>>` is `Clone`, so it
//! compiles): for HTTP, always use its HTTP form.
//!
//! What the HTTP form does after each attempt, with its default classifier
//! ([`classify::HttpClassifier`] has the full table) and the defaults of [`RetryLayer::new`]
//! (4 attempts, 500 ms doubling to 8 s with full jitter, a 30 s deadline, the default budget):
//!
//! | outcome of an attempt | retried? |
//! |---|---|
//! | transport or connect error, `TimeoutLayer` expiry | yes, unless the deadline has passed |
//! | `408`, `429`, `500`, `502`, `503`, `504`, `529` (an LLM provider overloaded) | yes, after the server's delay if sent: `retry-after-ms` (the LLM providers' milliseconds), else `Retry-After` (capped at 60 s) |
//! | a failure with `x-should-retry: true` or `false` (the LLM providers' SDK convention) | as the server says, whatever the status |
//! | `409` with `Retry-After` or `Idempotency-In-Progress: true`, gRPC `UNAVAILABLE` with `idempotency-in-progress: true` (an idempotency server: "still in progress"; `IdempotencyLayer` sends them) | yes, after it; if the deadline, the attempts or the budget run out first, `Err(RetryError)` with `is_in_progress()` (and `is_deadline()` when it was the deadline) and the `Idempotency-Key` to fetch the result later (gRPC: `DEADLINE_EXCEEDED`, the key in its metadata), never the `409` as the answer |
//! | gRPC `UNAVAILABLE`, `RESOURCE_EXHAUSTED` | yes, after `grpc-retry-pushback-ms` if sent; a negative pushback stops |
//! | anything else | no: returned as is |
//! | any of the above, on a `POST`/`PATCH` without an `Idempotency-Key` | no, unless keys are stamped or the request is marked `SafeToRetry` |
//! | refused by an open circuit below (`CircuitBreakerLayer`): never sent | yes, when the circuit admits a probe, not after the backoff, and without drawing on the budget; when that is after the deadline, at once `Err(RetryError)` with `is_circuit_open()` |
//!
//! # gRPC
//!
//! The HTTP form and `HttpTimeoutLayer` wrap a tonic `Channel` (with the adapters of the
//! `tonic` module, feature `tonic`) and send `grpc-timeout`. The classifier reads
//! `grpc-status` from the response headers (trailers-only answers, which is how tonic and
//! grpc-go send unary errors); for servers that send the status in trailers after the headers,
//! add [`grpc::GrpcTrailersLayer`] below the retry layer so the trailers are read before
//! classifying. reqwest users have the `reqwest` module (feature `reqwest`).
//!
//! # Feature flags
//!
//! | feature | enables |
//! |---|---|
//! | `metrics` | `tower_once_retry_{operations,attempts,retries,budget_refusals}_total`, `tower_once_retry_give_ups_total{reason}` and the histogram `tower_once_retry_delay_seconds`, through the `metrics` facade |
//!
//! # Minimum supported Rust version
//!
//! 1.88. Raising it is a minor-version change.

// Feature-gated items show their feature on docs.rs.
#![cfg_attr(docsrs, feature(doc_cfg))]
// Library code never unwraps: a panic on input is a bug (tests may).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod attempt;
/// How long to wait before the next attempt: exponential backoff with jitter (shared with the
/// circuit breaker's backed-off trips; from [`tower_once_core::backoff`]).
pub use tower_once_core::backoff;
/// A retry budget shared by all clones of a layer (shared with the hedging layer; from
/// [`tower_once_core::budget`]).
pub use tower_once_core::budget;
pub mod classify;
mod config;
mod error;
mod future;
pub mod grpc;
pub mod hook;
pub mod http;
mod layer;
mod metrics;
mod operation;
#[cfg(feature = "reqwest")]
#[cfg_attr(docsrs, doc(cfg(feature = "reqwest")))]
pub mod reqwest;
mod service;
mod stats;
#[cfg(feature = "tonic")]
#[cfg_attr(docsrs, doc(cfg(feature = "tonic")))]
pub mod tonic;

pub use self::error::{GiveUp, RetryError};
pub use self::future::ResponseFuture;
pub use self::layer::RetryLayer;
pub use self::service::Retry;
