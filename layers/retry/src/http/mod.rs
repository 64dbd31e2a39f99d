//! Retrying HTTP requests whose bodies are not `Clone`, safely.
//!
//! [`HttpRetryLayer`] is a [`RetryLayer`](crate::RetryLayer) for `http::Request`s, made with
//! [`RetryLayer::into_http`](crate::RetryLayer::into_http) (every retry setting carries over)
//! or [`HttpRetryLayer::new`] (the defaults with [`HttpClassifier`](crate::classify::HttpClassifier)). It classifies HTTP
//! responses with [`HttpClassifier`](crate::classify::HttpClassifier) unless another classifier was chosen with
//! [`classify`](HttpRetryLayer::classify), so `RetryLayer::new().into_http()` retries a `503`.
//! On top of the generic layer it:
//!
//! - **retries only safe requests**: idempotent methods (`GET`, `HEAD`, `OPTIONS`, `PUT`,
//!   `DELETE`, `TRACE`), requests carrying an `Idempotency-Key`, and requests marked
//!   [`SafeToRetry`](tower_once_core::resend::SafeToRetry) (no key is sent to a provider that would ignore it). Other requests get
//!   one attempt. With [`stamp_idempotency_keys`](HttpRetryLayer::stamp_idempotency_keys), an
//!   unkeyed `POST` or `PATCH` gets a fresh UUID key, the same on every attempt, and becomes
//!   retryable — the server's idempotency layer then runs it once;
//! - **buffers the body for replay**, up to [`body_limit`](HttpRetryLayer::body_limit)
//!   (1 MiB by default, as the server layer's limit). A larger body is sent once, streaming, and that request is not
//!   retried: replaying it would need unbounded memory;
//! - **puts the operation's [`Deadline`](tower_once_timeout::Deadline) in each attempt's extensions**, for an
//!   `HttpTimeoutLayer` below and the transport.
//!
//! ```
//! use std::time::Duration;
//! use tower_once_retry::RetryLayer;
//!
//! let layer = RetryLayer::new()
//!     .deadline(Duration::from_secs(10))
//!     .into_http()
//!     .stamp_idempotency_keys(true);
//! // The same, built from the HTTP layer:
//! let same = tower_once_retry::http::HttpRetryLayer::new()
//!     .deadline(Duration::from_secs(10))
//!     .stamp_idempotency_keys(true);
//! # let _ = same;
//! # let _ = layer;
//! ```

mod future;
mod layer;
mod replay;
mod service;

pub use self::future::ResponseFuture;
pub use self::layer::HttpRetryLayer;
pub use self::service::HttpRetry;
/// The request body the inner service receives: the bytes read (sent again as often as
/// needed), or the original body for a request sent once.
pub use tower_once_core::body::BufferedBody;
