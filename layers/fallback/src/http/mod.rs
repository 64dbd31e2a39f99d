//! The fallback for `http::Request`s, whose bodies need not be `Clone`.
//!
//! [`HttpFallbackLayer`] reads the request body (up to [`body_limit`](HttpFallbackLayer::body_limit),
//! 1 MiB by default) so that the secondary gets the same request, and knows what the rule
//! needs from the request itself: an idempotent method (`GET`, `HEAD`, `OPTIONS`, `PUT`,
//! `DELETE`, `TRACE`) or a [`SafeToRetry`](tower_once_core::resend::SafeToRetry) mark may go
//! to the secondary after any failure; an `Idempotency-Key` may when the secondary
//! [shares the primary's records](HttpFallbackLayer::shares_records).
//! [`stamp_idempotency_keys`](HttpFallbackLayer::stamp_idempotency_keys) gives an unkeyed
//! `POST` or `PATCH` a key *before* the primary sees it, so the secondary gets the same one.
//! A body over the limit goes to the primary, streaming, and never to the secondary.
//!
//! The secondary's responses carry the [`FromSecondary`] extension.
//!
//! ```
//! use std::time::Duration;
//! use tower_once_fallback::http::HttpFallbackLayer;
//!
//! type Body = tower_once_core::body::BufferedBody<String>;
//! let secondary = tower::service_fn(|_: http::Request<Body>| async {
//!     Ok::<_, std::io::Error>(http::Response::new("from provider B".to_owned()))
//! });
//! // An LLM completion has no side effects: any failure of the primary provider goes to the
//! // secondary, within one deadline.
//! let layer = HttpFallbackLayer::new(secondary)
//!     .side_effect_free(true)
//!     .deadline(Duration::from_secs(10));
//! # let _ = layer;
//! ```

mod future;
mod layer;
mod secondary;
mod service;

pub use self::future::ResponseFuture;
pub use self::layer::HttpFallbackLayer;
pub use self::secondary::FromSecondary;
// NOTE: named by the futures' types only, so not part of the stable API (tokio's rule for
// `doc(hidden)` items).
#[doc(hidden)]
pub use self::secondary::{MarkFuture, Markable, Secondary};
pub use self::service::HttpFallback;
/// The request body the inner service receives: the bytes read (sent again as often as
/// needed), or the original body for a request sent once.
pub use tower_once_core::body::BufferedBody;
