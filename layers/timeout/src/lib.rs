//! Deadline-aware timeouts for tower: a wall-clock cap per call that also respects what is left
//! of the whole operation's deadline.
//!
//! A retrying client has two clocks: each attempt should give up after, say, 2 s, and the
//! whole operation (every attempt and every backoff sleep) after, say, 10 s. [`TimeoutLayer`]
//! caps each call at `min(limit, remaining deadline)`; a call whose deadline is already spent
//! fails at once, without calling the inner service. `RetryLayer` sets the [`Deadline`]; a user
//! can set one too.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use tower::{Service, ServiceBuilder, ServiceExt};
//! use tower_once_timeout::{Deadline, TimeoutLayer};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let mut svc = ServiceBuilder::new()
//!     .layer(TimeoutLayer::new(Duration::from_secs(2)))
//!     .service_fn(|job: u32| async move {
//!         tokio::time::sleep(Duration::from_secs(1)).await;
//!         Ok::<_, std::convert::Infallible>(job * 2)
//!     });
//!
//! // Within the limit.
//! assert_eq!(svc.ready().await.unwrap().call(21).await.unwrap(), 42);
//!
//! // Only 500 ms of the operation's deadline left: that, not the 2 s limit, bounds the call.
//! let deadline = Deadline::after(Duration::from_millis(500));
//! let err = deadline.call(&mut svc, 21).await.unwrap_err();
//! assert!(err.elapsed().is_some_and(|e| e.is_deadline()));
//! # }
//! ```
//!
//! # Semantics
//!
//! | situation | result | inner service |
//! |---|---|---|
//! | the call finishes within `min(limit, deadline)` | its result (`Err` wrapped in [`TimeoutError::inner`]) | called once |
//! | the call runs past it | `Err` with [`Elapsed`] (the limit that fired; [`Elapsed::is_deadline`] if it was the deadline) | its future is dropped |
//! | the deadline has already passed | `Err` with [`Elapsed`] at once | **not called** |
//! | the result and the timer are ready in the same poll | the result | |
//!
//! Time is tokio's monotonic clock ([`tokio::time::Instant`]), so `#[tokio::test(start_paused =
//! true)]` tests control it. The deadline is the earliest of the one the request carries (a
//! [`Carrier`]: `http::Request`, `tonic::Request`, the worker's `Job`, the outbox's
//! `OutboxMessage`), the one in scope when the layer is called, and the one in scope while its
//! future is polled (so [`Deadline::call`] reaches a layer behind a `tower::buffer::Buffer`).
//! The inner service is called in the scope of the call's own (possibly tighter) deadline,
//! which the request also carries on, so layers below it, on this task or
//! another, see the time left too. The request type must be a [`Carrier`]; plain values
//! (`String`, numbers, ...) are, carrying nothing.
//!
//! For HTTP, [`http::HttpTimeoutLayer`] also can cover the response body and can send the time
//! left to the server in `grpc-timeout` or a header; [`http::ServerTimeoutLayer`] answers a status instead of an error
//! and can honour a client's `grpc-timeout`.
//!
//! # Differences from tower::timeout and tower-http's TimeoutLayer
//!
//! - The error keeps the inner service's error type ([`TimeoutError<E>`]) instead of erasing it
//!   into `BoxError`, and the expiry says which bound fired.
//! - The cap shrinks to the remaining [`Deadline`], and a spent deadline never reaches the
//!   inner service.
//! - Optional body cover, `grpc-timeout` in both directions, and gRPC-aware server answers.
//!
//! # Feature flags
//!
//! | feature | enables |
//! |---|---|
//! | `metrics` | `tower_once_timeout_timeouts_total{bound, layer}` through the `metrics` facade |
//!
//! # Minimum supported Rust version
//!
//! 1.88. Raising it is a minor-version change.

// Feature-gated items show their feature on docs.rs.
#![cfg_attr(docsrs, feature(doc_cfg))]
// Library code never unwraps: a panic on input is a bug (tests may).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod cap;
mod error;
pub mod grpc;
pub mod http;
mod metrics;
mod timeout;

pub use self::error::{Elapsed, TimeoutError};
pub use self::timeout::{ResponseFuture, Timeout, TimeoutLayer};
pub use tower_once_core::carrier::{self, Carrier};
pub use tower_once_core::deadline::{Deadline, InScope};
