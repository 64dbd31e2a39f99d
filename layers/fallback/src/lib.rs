//! A fallback for tower that never repeats an effect: when the primary service fails, the
//! same request goes to a secondary, with the same idempotency key and what is left of the
//! deadline, but only when that cannot run it twice.
//!
//! "Fail over to another provider" is the standard answer to a dependency that stays down
//! after its retries, or whose circuit is open. It is also a classic way to charge a card
//! twice: a request that timed out may have run on the primary, and sending it to the
//! secondary runs it again. [`FallbackLayer`] (and [`http::HttpFallbackLayer`] for HTTP) sends
//! a failed request on only when one of these holds:
//!
//! | the primary's outcome | the request | goes to the secondary |
//! |---|---|---|
//! | success, or the caller's own fault (`Stop`: a `400`, `404`, `422`) | any | no: returned as it is |
//! | a failure that **certainly did not run** ([`Unsent`](tower_once_core::unsent::Unsent)): its circuit was open, the connection was refused, nothing was sent; and the request is not a later attempt of a retry above (an earlier one may have run) | any | **yes** ([`Reason::Unsent`]) |
//! | a failure that **may have run**: a timeout after it was sent, a reset, a `5xx` from the handler, a `409` "still in progress" | an idempotent method (`GET`, `HEAD`, `OPTIONS`, `PUT`, `DELETE`, `TRACE`), or marked `SafeToRetry` | **yes** ([`Reason::Idempotent`]) |
//! | | any, the layer told it has no side effects ([`side_effect_free`](FallbackLayer::side_effect_free): LLM completions, searches) | **yes** ([`Reason::SideEffectFree`]) |
//! | | carrying an `Idempotency-Key`, the layer told the secondary shares the primary's idempotency records ([`shares_records`](FallbackLayer::shares_records): another region of the same service) | **yes** ([`Reason::SharedRecords`]): the two run it once between them |
//! | | anything else (a `POST` without a key, to a secondary of its own) | **no**: the primary's outcome is returned, for it may have run |
//! | any failure, once the deadline has passed | any | no: no time is left |
//!
//! A generic request cannot say whether it is idempotent or keyed: [`FallbackLayer`] sends on
//! only unsent failures unless told [`side_effect_free`](FallbackLayer::side_effect_free) or
//! [`shares_records`](FallbackLayer::shares_records) (the caller's word for every request).
//! The HTTP form reads the method, `SafeToRetry` and the `Idempotency-Key` header, and can
//! stamp a key before the primary sees the request, so the secondary gets the same one.
//!
//! # The stack it is made for
//!
//! ```text
//! FallbackLayer (one deadline for all)
//! ├── primary:   RetryLayer → CircuitBreakerLayer → TimeoutLayer → client of provider A
//! └── secondary: RetryLayer → TimeoutLayer → client of provider B
//! ```
//!
//! The primary's retries wait for its circuit or give up at once when it is open; the
//! fallback then sees an unsent failure (the circuit refused) and sends the request on, with
//! what is left of the deadline on the request, so the secondary's retry and timeout are
//! bound by it too.
//!
//! # Example
//!
//! ```
//! use std::sync::atomic::{AtomicU32, Ordering};
//! use std::sync::Arc;
//! use tower::{ServiceBuilder, ServiceExt};
//! use tower_once_fallback::FallbackLayer;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! // A primary that refuses connections: the request certainly never ran there.
//! let primary = tower::service_fn(|_: &'static str| async {
//!     Err::<&str, _>(std::io::Error::from(std::io::ErrorKind::ConnectionRefused))
//! });
//! let charged = Arc::new(AtomicU32::new(0));
//! let count = charged.clone();
//! let secondary = tower::service_fn(move |_: &'static str| {
//!     count.fetch_add(1, Ordering::SeqCst);
//!     async { Ok::<_, std::io::Error>("charged by B") }
//! });
//! let svc = ServiceBuilder::new()
//!     .layer(FallbackLayer::new(secondary))
//!     .service(primary);
//! assert_eq!(svc.oneshot("charge").await.unwrap(), "charged by B");
//! assert_eq!(charged.load(Ordering::SeqCst), 1);
//!
//! // A primary that reset the connection: the charge may have run there; no fallback.
//! let primary = tower::service_fn(|_: &'static str| async {
//!     Err::<&str, _>(std::io::Error::from(std::io::ErrorKind::ConnectionReset))
//! });
//! let secondary = tower::service_fn(|_: &'static str| async { Ok::<_, std::io::Error>("B") });
//! let err = FallbackLayer::new(secondary).layer_on(primary).oneshot("charge").await.unwrap_err();
//! assert!(err.is_primary());
//! # }
//! # trait LayerOn<P> { type S; fn layer_on(&self, p: P) -> Self::S; }
//! # impl<P, L: tower::Layer<P>> LayerOn<P> for L { type S = L::Service; fn layer_on(&self, p: P) -> L::Service { self.layer(p) } }
//! ```
//!
//! # Semantics
//!
//! | step | what happens |
//! |---|---|
//! | call | the deadline (the layer's own, or an earlier one the request carries or has in scope) is put on the request; a copy is kept (HTTP: the body is read, up to a limit) |
//! | primary answers | classified with the shared vocabulary (`RetryOnError` by default, `HttpClassifier` for HTTP): `Retry` and `InProgress` are failures, the rest is returned |
//! | failure, the rule allows it | the hook is called; the copy goes to a clone of the secondary, within what is left of the deadline; its answer (HTTP: marked [`FromSecondary`](http::FromSecondary)) or error ([`FallbackError::is_secondary`]) is returned |
//! | failure, the rule refuses it | the primary's outcome is returned (an error as [`FallbackError::is_primary`]) |
//! | the deadline passes while the secondary runs | [`FallbackError::is_deadline`]: it may still complete there |
//!
//! Copies of a request (hedges) make an unsent failure say nothing of the operation, for
//! another copy may have run on the primary. A fallback below a hedging layer sees the
//! request's [`Hedged`](tower_once_core::attempt::Hedged) mark; one above a hedging layer
//! learns that it sent a copy while the fallback polls its primary, and through the
//! [`CopyWatch`](tower_once_core::attempt::CopyWatch) it puts on the request, which a
//! [`Carrier`](tower_once_core::carrier::Carrier) type (`http::Request`) takes to a spawned
//! task; a plain request type (`String`) handled on another task is not seen there.
//!
//! Every fallback is an `INFO` `tracing` event (`reason`), every refusal of one a `DEBUG`
//! event.
//!
//! # Feature flags
//!
//! | feature | enables |
//! |---|---|
//! | `metrics` | `tower_once_fallback_fallbacks_total{reason}` and `tower_once_fallback_withheld_total` (failures kept from the secondary because they may have run), through the `metrics` facade |
//!
//! # Minimum supported Rust version
//!
//! 1.88. Raising it is a minor-version change.

// Feature-gated items show their feature on docs.rs.
#![cfg_attr(docsrs, feature(doc_cfg))]
// Library code never unwraps: a panic on input is a bug (tests may).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod config;
mod error;
mod future;
pub mod hook;
pub mod http;
mod layer;
mod metrics;
mod rule;
mod service;

pub use self::error::FallbackError;
pub use self::future::ResponseFuture;
pub use self::layer::FallbackLayer;
pub use self::rule::Reason;
pub use self::service::Fallback;
