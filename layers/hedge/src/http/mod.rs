//! Hedging `http::Request`s, whose bodies need not be `Clone`, only when that is safe.
//!
//! [`HttpHedgeLayer`] hedges only requests that may be sent more than once
//! ([`tower_once_core::resend`]): an idempotent method, an `Idempotency-Key` (the same on every
//! copy, so the server runs the operation once), or a `SafeToRetry` mark. With
//! [`stamp_idempotency_keys`](HttpHedgeLayer::stamp_idempotency_keys), an unkeyed `POST` or
//! `PATCH` gets a fresh key first, and is hedged. Other requests get one attempt, unhedged.
//! The body is read (up to [`body_limit`](HttpHedgeLayer::body_limit), 1 MiB by default) so
//! every copy carries it; a larger one is sent once, streaming.
//!
//! Against a server behind `IdempotencyLayer`, the copy that arrives second finds the key
//! claimed and is answered `409` in progress: that is not a failure (it classifies as
//! `InProgress`), so the layer waits for the copy that holds the claim.
//!
//! ```
//! use std::time::Duration;
//! use tower_once_hedge::http::HttpHedgeLayer;
//!
//! // POSTs get a key and are hedged after 200 ms without an answer.
//! let layer = HttpHedgeLayer::new(Duration::from_millis(200)).stamp_idempotency_keys(true);
//! # let _ = layer;
//! ```

mod future;
mod layer;
mod service;

pub use self::future::ResponseFuture;
pub use self::layer::HttpHedgeLayer;
pub use self::service::HttpHedge;
/// The request body the inner service receives: the bytes read (sent again as often as
/// needed), or the original body for a request sent once.
pub use tower_once_core::body::BufferedBody;
