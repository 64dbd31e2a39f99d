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
//!   `Clone`. Replaying non-`Clone` HTTP bodies and idempotency-key stamping are not there yet.
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
//! # Feature flags
//!
//! | feature       | default | enables |
//! |---------------|---------|---------|
//! | `idempotency` | yes     | [`idempotency`]: `IdempotencyLayer` and the in-memory store |
//! | `retry`       | no      | [`retry`]: `RetryLayer`, backoff, budget, classifiers (enables `timeout`) |
//! | `timeout`     | no      | [`timeout`]: `TimeoutLayer`, `HttpTimeoutLayer`, `ServerTimeoutLayer`, `Deadline` |
//! | `redis`       | no      | `idempotency::store::redis`: the Redis / Redis Cluster store |
//! | `full`        | no      | all of the above |
//!
//! # Minimum supported Rust version
//!
//! 1.88. Raising it is a minor-version change.

// Library code never unwraps: a panic on input is a bug (tests may).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]
#![cfg_attr(docsrs, feature(doc_auto_cfg))]

#[cfg(feature = "idempotency")]
#[doc(inline)]
pub use tower_once_idempotency as idempotency;

#[cfg(feature = "retry")]
#[doc(inline)]
pub use tower_once_retry as retry;

#[cfg(feature = "timeout")]
#[doc(inline)]
pub use tower_once_timeout as timeout;

/// Compiles the README's Rust examples as doctests, so the README cannot drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
