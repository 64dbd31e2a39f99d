//! A ready-made HTTP sender (feature `http`): each topic's messages become requests through
//! any tower HTTP client, classified as HTTP answers before the relay sees them.
//!
//! [`HttpSender`] is a `tower::Service<OutboxMessage>` over any
//! `tower::Service<http::Request<Full<Bytes>>>` that answers `http::Response`s: hyper-util's
//! legacy `Client`, `tower_once_retry::reqwest::ReqwestService`, or either under a
//! `RetryLayer::new().into_http()` and an `HttpTimeoutLayer`. A topic's [`Route`] fixes the
//! method, URI and headers; the message adds its dedupe key as the `Idempotency-Key` header
//! and its payload as the body, so a provider that honours the header (an `IdempotencyLayer`
//! server, Stripe...) has the effect once even when the relay sends twice.
//!
//! The sender classifies the answer itself ([`HttpClassifier`](../classify/struct.HttpClassifier.html)
//! by default, or [`HttpSender::classify`]), and only a success comes back as `Ok`: the
//! relay's default classifier, [`SendClassifier`](../classify/struct.SendClassifier.html), follows
//! the verdict an [`HttpSendError`] carries. A `503` never counts as sent, and no classifier
//! has to be remembered on the relay.
//!
//! # Example
//!
//! ```no_run
//! use std::time::Duration;
//! use http::header::{HeaderValue, CONTENT_TYPE};
//! use http::Uri;
//! use hyper_util::client::legacy::Client;
//! use hyper_util::rt::TokioExecutor;
//! use tower::ServiceBuilder;
//! use tower_once_outbox::http::{HttpSender, Route};
//! use tower_once_outbox::{Outbox, OutboxRelay, RelayConfig};
//! use tower_once_retry::RetryLayer;
//! use tower_once_timeout::http::HttpTimeoutLayer;
//!
//! # mod tower_once { pub async fn shutdown_signal() {} }
//! # async fn run(outbox: Outbox) -> Result<(), Box<dyn std::error::Error>> {
//! // In-process retries of blips (a keyed POST is safe to repeat), each attempt capped; the
//! // relay's deadline bounds them all.
//! let client = ServiceBuilder::new()
//!     .layer(RetryLayer::new().into_http())
//!     .layer(HttpTimeoutLayer::new(Duration::from_secs(5)))
//!     .service(Client::builder(TokioExecutor::new()).build_http());
//! let sender = HttpSender::new(client).route(
//!     "email",
//!     Route::post(Uri::from_static("http://mailer.internal/v1/send"))
//!         .header(CONTENT_TYPE, HeaderValue::from_static("application/json")),
//! );
//! let relay = OutboxRelay::new(outbox, RelayConfig::new(), sender)?;
//! relay.run(tower_once::shutdown_signal()).await; // SIGTERM or SIGINT (the `tower-once` crate)
//! # Ok(())
//! # }
//! ```
//!
//! # Semantics
//!
//! With the default classifiers (the sender's [`HttpClassifier`](../classify/struct.HttpClassifier.html),
//! the relay's [`SendClassifier`](../classify/struct.SendClassifier.html)):
//!
//! | outcome | the sender answers | the relay |
//! |---|---|---|
//! | `2xx` | `Ok(`[`Delivered`]`)` | marks the row sent |
//! | `3xx` (a redirect, which the sender does not follow) | [`HttpSendError::is_status`], [permanent](HttpSendError::is_permanent) | parks the row: fix the route's URL |
//! | `408`, `429`, `500`, `502`, `503`, `504`, `529`, or `409` with `Retry-After` (or a failure with `x-should-retry: true`) | [`HttpSendError::is_status`], with the server's delay | `attempts + 1`; the next attempt after the server's `retry-after-ms` or `Retry-After`, or the backoff |
//! | any other status (`400`, `404`, `422`...) | [`HttpSendError::is_status`], [permanent](HttpSendError::is_permanent) | parks the row, with the provider's status and words in `last_error` |
//! | the client fails (connect, timeout, a retry layer giving up) | [`HttpSendError::is_transport`] | `attempts + 1`, the backoff |
//! | the topic has no route | [`HttpSendError::is_unrouted`]; no request is made | `attempts + 1`, the backoff; parked after `max_attempts` |
//! | the dedupe key is no header value (a row written around [`Outbox::enqueue`](crate::Outbox::enqueue)) | [`HttpSendError::is_invalid_key`]; no request is made | parks the row |
//!
//! A topic without a route is retried rather than parked: during a rolling deploy, a relay
//! that does not know a new topic yet leaves it to those that do. To park such rows at once,
//! give the relay a classifier that stops on [`HttpSendError::is_unrouted`].
//!
//! The response body is read (up to 64 KiB) so the connection can carry the next message and
//! a failure's text reaches the row's `last_error`. Reading stops 100 ms before the send's
//! deadline: a body that arrives too slowly is cut, and never turns an answer into a timeout.
//!
//! Wrapping the sender in a layer whose error is a `Box<dyn Error + Send + Sync>` keeps the
//! verdict (the relay's classifier searches the `source()` chain); a layer with an error type
//! of its own hides it, so give the relay a classifier that reaches the [`HttpSendError`] and
//! returns its [`action`](HttpSendError::action). Layers that need the request (retry,
//! timeout) belong below the sender, on the client.
//!
//! # Differences from a hand-written sender
//!
//! A `service_fn` around an HTTP client answers `Ok(response)` whatever the status, so the
//! relay must be given an HTTP classifier or a `503` counts as sent. [`HttpSender`] answers
//! `Ok` only for a success, and its [`Delivered`] is not an `http::Response`: giving the relay
//! an HTTP classifier on top does not compile, rather than retrying a `400` until
//! `max_attempts` and forgetting the `Retry-After`.

mod error;
mod future;
mod response;
mod route;
mod sender;

pub use self::error::HttpSendError;
pub use self::future::ResponseFuture;
pub use self::response::Delivered;
pub use self::route::Route;
pub use self::sender::HttpSender;
