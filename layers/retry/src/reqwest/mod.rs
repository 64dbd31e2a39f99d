//! reqwest clients: the HTTP retry and timeout layers over a `reqwest::Client`, with requests
//! built the reqwest way (feature `reqwest`).
//!
//! [`Client`] is one cloneable object, as `reqwest_middleware::ClientWithMiddleware` is: build
//! requests with reqwest's methods, [`send`](RequestBuilder::send) them, get a
//! `reqwest::Response` or one [`Error`] that answers `is_elapsed()`, `is_deadline()`,
//! `attempts()` and holds reqwest's error.
//!
//! ```no_run
//! # async fn run() -> Result<(), tower_once_retry::reqwest::Error> {
//! use std::time::Duration;
//! use tower_once_retry::reqwest::Client;
//! use tower_once_retry::RetryLayer;
//!
//! let client = Client::builder(reqwest::Client::new())
//!     .retry(RetryLayer::new().deadline(Duration::from_secs(10)).into_http().stamp_idempotency_keys(true))
//!     .attempt_limit(Duration::from_secs(2))
//!     .build();
//!
//! let charge = client
//!     .post("http://127.0.0.1:3000/charges")
//!     .json(&serde_json::json!({ "order_id": "A", "amount": 500 }))
//!     .send() // one Idempotency-Key on every attempt
//!     .await?;
//! println!("{}", charge.status());
//!
//! // A completion has no side effect: retried without sending a key to the provider.
//! let completion = client
//!     .post("https://llm.example/v1/messages")
//!     .json(&serde_json::json!({ "prompt": "hello" }))
//!     .safe_to_retry()
//!     .send()
//!     .await;
//! match completion {
//!     Ok(response) => println!("{}", response.status()),
//!     Err(e) if e.is_deadline() => println!("out of time after {} attempts", e.attempts()),
//!     Err(e) => println!("{e}"),
//! }
//! # Ok(())
//! # }
//! ```
//!
//! For a stack of your own (more layers, another classifier type kept visible),
//! [`ReqwestService`] makes a `reqwest::Client` a `tower::Service<http::Request<B>>`, and
//! [`RequestBuilderExt::send_with`] sends a request built with reqwest's builder through it.
//!
//! # Compared with reqwest-middleware and reqwest-retry
//!
//! The same client with reqwest-middleware and reqwest-retry, from their READMEs (not
//! dependencies of this crate, so this block is not compiled):
//!
//! ```rust,ignore
//! let retry_policy = ExponentialBackoff::builder().build_with_max_retries(3);
//! let client = ClientBuilder::new(reqwest::Client::new())
//!     .with(RetryTransientMiddleware::new_with_policy(retry_policy))
//!     .build();
//! let response = client.post(url).json(&order).send().await?; // retried whatever the method
//! ```
//!
//! | | [`Client`] | reqwest-middleware + reqwest-retry |
//! |---|---|---|
//! | one cloneable client, reqwest's request builder | ✓ | ✓ (`ClientWithMiddleware`) |
//! | transient errors and 5xx retried, jittered backoff | ✓ | ✓ |
//! | `Retry-After` honoured | ✓ (both forms, capped) | n/d |
//! | one deadline over all attempts and waits | ✓ | – (a total retry duration bounds the backoff only) |
//! | a per-attempt timeout capped by the time left | ✓ | – (reqwest's timeout, per attempt, fixed) |
//! | retry budget against storms | ✓ shared by clones | – |
//! | only idempotent, keyed or [`safe_to_retry`](RequestBuilder::safe_to_retry) requests retried | ✓ | – (any request) |
//! | one `Idempotency-Key` stamped on every attempt | ✓ | – |
//! | an idempotency server's "in progress" told apart, at the deadline too | ✓ (`is_in_progress`, the key to fetch the result) | – (the `409` is the answer) |
//! | one error type | `is_elapsed()`, `is_deadline()`, `attempts()`, `idempotency_key()`, reqwest's error inside | `reqwest_middleware::Error` (reqwest's or the middleware's) |
//! | streaming bodies replayed | ✓ buffered up to 1 MiB | – (needs a cloneable body) |
//! | other middleware (auth, tracing, caching) | tower layers, with [`ReqwestService`] | reqwest-middleware's own |
//! | the same layers on hyper and tonic clients | ✓ (plain tower) | – (reqwest only) |
//!
//! The client boxes the stack's future once per request (reqwest boxes its own too), so that
//! [`Client`] has no type parameters.

mod client;
mod error;
mod pending;
mod request;
mod send_with;
mod service;
mod stack;

pub use self::client::{Client, ClientBuilder};
pub use self::error::Error;
pub use self::pending::Pending;
pub use self::request::RequestBuilder;
pub use self::send_with::{RequestBuilderExt, SendError, SendWith};
pub use self::service::{ReqwestService, ResponseFuture};
