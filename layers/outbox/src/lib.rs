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
//! relay.run(async { let _ = tokio::signal::ctrl_c().await; }).await;
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
//! The schema is `migrations/0001_outbox.sql` (PostgreSQL 14+): copy it into your migrations,
//! or call [`Outbox::migrate`], which runs it under an advisory lock.
//!
//! # HTTP senders
//!
//! [`OutboxMessage::http_request`] builds the `POST` with `Idempotency-Key: <dedupe key>`, so
//! a provider behind tower-once's `IdempotencyLayer` (or Stripe, or any provider that honours
//! the header) turns the relay's one double send into one effect. An HTTP sender answers
//! `Ok(response)` whatever the status, so **classify it with [`HttpClassifier`](classify::HttpClassifier)**
//! (or your own): with the default, [`RetryOnError`](classify::RetryOnError), a `503` would
//! count as sent. A row has a topic and a payload, no headers: set the `Content-Type` from the
//! topic.
//!
//! ```no_run
//! use bytes::Bytes;
//! use http_body_util::Full;
//! use hyper_util::client::legacy::Client;
//! use hyper_util::rt::TokioExecutor;
//! use tower::ServiceExt;
//! use tower_once_outbox::classify::HttpClassifier;
//! use tower_once_outbox::{Outbox, OutboxMessage, OutboxRelay, RelayConfig};
//!
//! # async fn run(outbox: Outbox) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
//! let sender = tower::service_fn(move |message: OutboxMessage| {
//!     let client = client.clone();
//!     async move {
//!         let mut request = message.http_request("http://mailer.internal/v1/send")?.map(Full::new);
//!         request.headers_mut().insert("content-type", "application/json".parse()?);
//!         let response = client.oneshot(request).await?;
//!         Ok::<_, Box<dyn std::error::Error + Send + Sync>>(response)
//!     }
//! });
//! let relay = OutboxRelay::new(outbox, RelayConfig::new(), sender)?.classify(HttpClassifier);
//! relay.run(std::future::pending::<()>()).await;
//! # Ok(())
//! # }
//! ```
//!
//! # Feature flags
//!
//! | feature | enables |
//! |---|---|
//! | `metrics` | the counter `tower_once_outbox_sends_total{outcome}` ([`SendOutcome::as_str`]) through the `metrics` facade |
//!
//! # Minimum supported Rust version
//!
//! 1.88. Raising it is a minor-version change.

// Library code never unwraps: a panic on input is a bug (tests may).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod config;
mod error;
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

/// How a sender's outcome is classified (`Classify`, `Action`, `HttpClassifier`,
/// `RetryOnError`): the retry crate's vocabulary, re-exported.
pub use tower_once_retry::classify;

/// The relay's backoff after a failed attempt (`Backoff`, `Jitter`), from the retry crate.
pub use tower_once_retry::backoff;
