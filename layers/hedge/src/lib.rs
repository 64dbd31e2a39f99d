//! Hedged requests for tower that are safe for `POST`s: when an answer is slow, send the same
//! request again (the same idempotency key on every copy), and take the first good answer.
//!
//! Tail latency is mostly bad luck: a slow replica, a lost packet, a GC pause. A second copy
//! of the request sent after the usual answer time (a fixed delay, or a latency percentile the
//! layer observes) usually answers before the first, cutting the tail at little cost ("The
//! Tail at Scale"). Hedging runs a request twice, so it must be safe to: tower's hedge leaves
//! that to the user; here
//!
//! - [`http::HttpHedgeLayer`] hedges only requests that may be sent more than once (an
//!   idempotent method, an `Idempotency-Key`, a `SafeToRetry` mark), and can stamp a key on a
//!   `POST` first, the same on every copy: against a server behind `IdempotencyLayer`, the
//!   operation runs once, and a copy answered `409` "still in progress" (another copy holds the
//!   claim) waits for the copy that holds it;
//! - the generic [`HedgeLayer`] applies the same rule to requests that can tell
//!   ([`Carrier::may_send_twice`](tower_once_core::carrier::Carrier::may_send_twice)): on an
//!   `http::Request` it never copies an unkeyed `POST` either;
//! - a copy can be answered only once the server's handler is reached: against a server behind
//!   `IdempotencyLayer`, a copy that arrives while another copy's handler runs is answered
//!   `409` (waited out) and one that arrives after it is replayed, so hedging cuts slowness
//!   before the handler (a slow replica, a lost packet), never inside the handler itself;
//! - hedges and retries draw on **one** [`RetryBudget`](tower_once_core::budget::RetryBudget)
//!   (pass the retry layer's to [`budget`](HedgeLayer::budget)), as gRPC's hedging shares its
//!   retry throttle: in an outage, slow answers do not multiply load;
//! - no hedge is sent at or after the operation's deadline, which every copy carries;
//! - [`on_hedge`](HedgeLayer::on_hedge) is told each hedge sent ([`hook::OnHedge`], the same
//!   shape as the retry layer's and the fallback's hooks).
//!
//! # Example
//!
//! ```
//! use std::sync::atomic::{AtomicU32, Ordering};
//! use std::sync::Arc;
//! use std::time::Duration;
//! use tower::{ServiceBuilder, ServiceExt};
//! use tower_once_hedge::HedgeLayer;
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let calls = Arc::new(AtomicU32::new(0));
//! let count = calls.clone();
//! // The first replica takes 5 s; the next answers in 10 ms.
//! let svc = ServiceBuilder::new()
//!     .layer(HedgeLayer::new(Duration::from_millis(100)))
//!     .service_fn(move |key: &'static str| {
//!         let slow = count.fetch_add(1, Ordering::SeqCst) == 0;
//!         async move {
//!             let took = if slow { 5000 } else { 10 };
//!             tokio::time::sleep(Duration::from_millis(took)).await;
//!             Ok::<_, std::io::Error>(key)
//!         }
//!     });
//! let started = tokio::time::Instant::now();
//! assert_eq!(svc.oneshot("profile:7").await.unwrap(), "profile:7");
//! assert_eq!(started.elapsed(), Duration::from_millis(110));
//! assert_eq!(calls.load(Ordering::SeqCst), 2);
//! # }
//! ```
//!
//! # Semantics
//!
//! | event | the layer |
//! |---|---|
//! | call | sends the first attempt; plans hedges when the delay is known (a fixed one, or a percentile once a period with enough latencies has passed) and the deadline leaves room for one |
//! | no answer after the delay | sends a hedge (a copy of the request, marked as a hedge of its attempt), if the deadline has not passed and the budget allows; again after the delay, up to [`max_hedges`](HedgeLayer::max_hedges) |
//! | a copy answers `Success` or `Stop` | that is the answer: the other copies are dropped (cancelled) |
//! | a copy answers `InProgress` (a `409` from an idempotency server: another copy holds the claim) | waits for the others; returned only when none answers better |
//! | a copy fails (`Retry`) | waits for the others; when none is left in flight, the failure is returned at once (retrying is the retry layer's work: put this layer inside a `RetryLayer`) |
//!
//! The layer does not end operations at their deadline: put it inside a `RetryLayer` (or under
//! a `TimeoutLayer`), which does. Hedges carry the attempt's mark as a hedge
//! ([`Attempt::is_hedge`](tower_once_core::attempt::Attempt::is_hedge)): a circuit breaker
//! below does not count them as operations, and a retry layer below makes one attempt of each.
//! A hedge that is refused by a circuit below is simply not the answer.
//!
//! # Placement
//!
//! `RetryLayer` → `HedgeLayer` → `CircuitBreakerLayer` → `TimeoutLayer` → transport: the retry
//! layer handles failures and the deadline, the hedging layer slowness of each attempt.
//!
//! # Differences from tower::hedge
//!
//! tower's `Hedge` hedges every request its policy lets it clone, records the latency of
//! every response, turns errors into `BoxError`, and has no layer. Here the HTTP form hedges
//! only requests that are safe to run twice (and can make a `POST` so), the error type is the
//! inner service's, hedges share the retry budget, and a `409` in progress is waited out.
//!
//! # Feature flags
//!
//! | feature | enables |
//! |---|---|
//! | `metrics` | `tower_once_hedge_hedges_total`, `tower_once_hedge_wins_total` (a hedge answered first) and `tower_once_hedge_budget_refusals_total`, through the `metrics` facade |
//!
//! # Minimum supported Rust version
//!
//! 1.88. Raising it is a minor-version change.

// Feature-gated items show their feature on docs.rs.
#![cfg_attr(docsrs, feature(doc_cfg))]
// Library code never unwraps: a panic on input is a bug (tests may).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod config;
mod future;
pub mod hook;
pub mod http;
mod latency;
mod layer;
mod metrics;
mod plan;
mod service;

pub use self::future::ResponseFuture;
// NOTE: named by the futures' types only: not part of the stable API.
pub use self::layer::HedgeLayer;
#[doc(hidden)]
pub use self::plan::{Cloned, Copies};
pub use self::service::Hedge;
