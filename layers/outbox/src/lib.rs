//! A transactional outbox on Postgres for tower: a handler writes its result and the messages
//! that announce it in **one transaction**, and an [`OutboxRelay`] sends them afterwards
//! through any `tower::Service<OutboxMessage>`, at least once, with the message's dedupe key as
//! the provider's idempotency key, so each has its effect once.
//!
//! A process can die between any two steps of "write the result, then send the email". With
//! the outbox there is no such gap: the email is a row committed with the result, or neither
//! exists. What remains is the relay's own gap (sent, then died before recording it), which the
//! dedupe key closes at the provider.
//!
//! # Example
//!
//! ```no_run
//! use std::time::Duration;
//! use tower::ServiceBuilder;
//! use tower_once_outbox::{Outbox, OutboxMessage, OutboxRelay, RelayConfig};
//!
//! # mod tower_once { pub async fn shutdown_signal() {} }
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let pool = sqlx::PgPool::connect("postgres://127.0.0.1/app").await?;
//! let outbox = Outbox::new(pool.clone());
//! outbox.migrate().await?;
//!
//! // In the handler: the business write and the message commit together.
//! let mut tx = pool.begin().await?;
//! sqlx::query("INSERT INTO orders (id) VALUES ($1)").bind(42_i64).execute(&mut *tx).await?;
//! outbox.enqueue(&mut tx, "email", "order-42:confirmation", r#"{"to":"a@example.com"}"#).await?;
//! tx.commit().await?;
//!
//! // Elsewhere, any number of relays: a `tower::Service<OutboxMessage>` does the sending.
//! let sender = ServiceBuilder::new().service_fn(|message: OutboxMessage| async move {
//!     println!("sending {} with key {}", message.topic(), message.dedupe_key());
//!     Ok::<_, std::io::Error>(())
//! });
//! let relay = OutboxRelay::new(outbox, RelayConfig::new().lease(Duration::from_secs(30)), sender)?;
//! // SIGTERM or SIGINT (`shutdown_signal` is in the `tower-once` crate, feature `signal`).
//! relay.run(tower_once::shutdown_signal()).await;
//! # Ok(())
//! # }
//! ```
//!
//! # Semantics
//!
//! | step | Postgres |
//! |---|---|
//! | [`Outbox::enqueue`] in the caller's transaction | `INSERT ... ON CONFLICT (dedupe_key) DO NOTHING`: the same key, topic and payload are written once ([`Enqueued::Duplicate`]); the same key with other content is an error ([`OutboxError::is_key_reused`]); a statement trigger sends `NOTIFY` at commit |
//! | a relay's pass | one statement: `SELECT ... FOR UPDATE SKIP LOCKED LIMIT batch_size` on due rows, then `leased_until = now() + lease` and a fresh lease token on them; the row locks end with it |
//! | sending | each row on its own task, through the sender, inside a [`Deadline`](tower_once_timeout::Deadline) of `send_timeout` (80 % of the lease) counted from *before* the claim: a `RetryLayer`/`TimeoutLayer` in the sender stops before the lease runs out, and a send that could not start in time (a slow statement earlier in the pass) is released unsent instead of racing another relay |
//! | classified `Success` | `sent_at = now()`, in one `UPDATE ... WHERE id = ANY(..)` for every send of the pass that finished by then (not fenced: they were sent); retried 3 times if Postgres fails, else sent again after the lease with the same key |
//! | classified `Retry { after }`, an error, a timeout or a panic | `attempts + 1`, `last_error`, `next_attempt_at = now() + after` (the provider's `Retry-After`) or the backoff; fenced by the lease token |
//! | classified `Stop`, or `attempts` reaches `max_attempts` | parked (`parked_at`): [`Outbox::parked`] lists them, [`Outbox::retry_parked`] sends one again (and `NOTIFY`s running relays) |
//! | a relay dies mid-send | its rows come back when the lease runs out, counted as an attempt (so a message that kills relays is parked too) |
//! | shutdown | no new pass; sends in flight get `shutdown_grace`, the rest are released (`next_attempt_at = now()`) |
//! | sent rows | deleted after `retain_sent` (7 days), which is also how long a dedupe key is remembered |
//!
//! Several relays never send the same row at once while leases hold: `SKIP LOCKED` and the lease
//! keep them apart, and a row is claimable again only after its lease. The one double send is the
//! documented one: a relay that sent and then could not record it (it died, or Postgres did)
//! leaves the row to be sent again after the lease, with the same dedupe key.
//!
//! The relay listens on a connection of its own (made with the pool's options, outside the
//! pool), so even a one-connection pool is left for the passes. Error texts are stored with
//! NUL replaced and cut to 2 KiB.
//!
//! The relay keeps up to `batch_size` sends in flight and refills free slots (once a quarter is
//! free) while others still run, so a hanging provider holds only its own rows. Compared with
//! an outbox whose relay locks its rows while it sends, this relay holds no row lock across the
//! network call (a claim is a short statement plus a lease), a dead relay's rows come back by
//! themselves, it wakes on `LISTEN/NOTIFY` instead of only polling, the provider's
//! `Retry-After` sets the next attempt, and a panic or a hang in the sender is a counted attempt
//! instead of a stuck row.
//!
//! The schema is `migrations/0001_outbox.sql` (PostgreSQL 14+): copy it into your migrations
//! (`Outbox::migration_sql()` gives it for another table name), or call [`Outbox::migrate`],
//! which runs it under an advisory lock.
//!
//! # HTTP senders
//!
//! With feature `http`, [`http::HttpSender`] is the sender for HTTP providers: a
//! [`Route`](http::Route) per topic (method, URI, headers), the dedupe key as the
//! `Idempotency-Key` header and the payload as the body, over any tower HTTP client
//! (hyper-util's, reqwest's through `tower_once_retry::reqwest`, with the retry and timeout
//! layers below it). It classifies the answers itself, so with the relay's default classifier
//! a `503` is retried after its `Retry-After` and a `400` is parked; the [module docs](http)
//! have the table.
//!
//! ```no_run
//! # mod tower_once { pub async fn shutdown_signal() {} }
//! # #[cfg(feature = "http")]
//! # async fn run(outbox: tower_once_outbox::Outbox) -> Result<(), Box<dyn std::error::Error>> {
//! use http::header::{HeaderValue, CONTENT_TYPE};
//! use http::Uri;
//! use hyper_util::client::legacy::Client;
//! use hyper_util::rt::TokioExecutor;
//! use tower_once_outbox::http::{HttpSender, Route};
//! use tower_once_outbox::{OutboxRelay, RelayConfig};
//!
//! let client = Client::builder(TokioExecutor::new()).build_http();
//! let sender = HttpSender::new(client).route(
//!     "email",
//!     Route::post(Uri::from_static("http://mailer.internal/v1/send"))
//!         .header(CONTENT_TYPE, HeaderValue::from_static("application/json")),
//! );
//! let relay = OutboxRelay::new(outbox, RelayConfig::new(), sender)?;
//! relay.run(tower_once::shutdown_signal()).await;
//! # Ok(())
//! # }
//! ```
//!
//! A sender written by hand around an HTTP client answers `Ok(response)` whatever the status:
//! give its relay `.classify(HttpClassifier)` ([`classify::HttpClassifier`]), or a `503` counts
//! as sent. [`OutboxMessage::http_request`] builds its request (a `POST` with the
//! `Idempotency-Key`).
//!
//! # Feature flags
//!
//! | feature | enables |
//! |---|---|
//! | `http` | [`http`]: [`HttpSender`](http::HttpSender), the ready-made HTTP sender (adds `http-body`, `http-body-util`, `pin-project-lite`) |
//! | `metrics` | the counter `tower_once_outbox_sends_total{outcome}` ([`SendOutcome::as_str`]) through the `metrics` facade |
//!
//! # Minimum supported Rust version
//!
//! 1.88. Raising it is a minor-version change.

// Library code never unwraps: a panic on input is a bug (tests may).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod classify;
pub mod config;
mod error;
#[cfg(feature = "http")]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
pub mod http;
mod message;
mod metrics;
mod outbox;
mod relay;
mod schema;

pub use self::config::RelayConfig;
pub use self::error::OutboxError;
pub use self::message::{
    Enqueued, OutboxMessage, OutboxStats, ParkedMessage, DEFAULT_MAX_PAYLOAD, MAX_KEY_LEN,
    MAX_TOPIC_LEN,
};
pub use self::metrics::SendOutcome;
pub use self::outbox::Outbox;
pub use self::relay::{OutboxRelay, PassReport, RelayReport};

/// The `sqlx` this crate is built on, to make pools and transactions of the matching version.
pub use ::sqlx;

/// The relay's backoff after a failed attempt (`Backoff`, `Jitter`), from the retry crate.
pub use tower_once_retry::backoff;
