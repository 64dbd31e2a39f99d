//! Pieces shared by tower-once's layers: a request/response body that may be held in memory,
//! a bounded, copy-avoiding chunk collector, how gRPC traffic is recognised and its status
//! codes, the [`Carrier`](carrier::Carrier) that takes an operation's context along with a
//! request, the outage backoff and the refill rule of the loops, checked SQL table names, and clock arithmetic that
//! never panics.
//!
//! Users meet these through the layers: [`body::BufferedBody`] as
//! `tower_once_idempotency::{RequestBody, ResponseBody}` and the request body below the HTTP
//! client layers (`tower_once_retry::http::BufferedBody`),
//! [`grpc::Code`] as `tower_once_idempotency::problem::Code`, [`carrier::Carrier`] as
//! `tower_once_timeout::Carrier`. So this crate follows semantic versioning as they do: a
//! breaking change to anything public here is a breaking change of the layers, released with
//! them.

// Feature-gated items show their feature on docs.rs.
#![cfg_attr(docsrs, feature(doc_cfg))]
// Library code never unwraps: a panic on input is a bug (tests may).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod attempt;
pub mod backoff;
pub mod body;
pub mod budget;
pub mod carrier;
pub mod classify;
pub mod deadline;
pub mod replay;
pub mod resend;
pub mod table;
pub mod unsent;

// NOTE: the layers' shared plumbing, public only because the layers are crates of their own.
// As in tokio, `doc(hidden)` items are not part of the public and stable API: they change
// with any release, and users never need to name them.
#[doc(hidden)]
pub mod chain;
#[doc(hidden)]
pub mod hook;
#[doc(hidden)]
pub mod outage;
#[doc(hidden)]
pub mod scope;
#[doc(hidden)]
pub mod shard;
#[doc(hidden)]
pub mod slots;
#[doc(hidden)]
pub mod time;

/// Panics with the one message every tower-once future gives when it is polled again after it
/// completed (a caller's bug, as for any future).
#[cold]
#[track_caller]
pub fn polled_after_completion(future: &'static str) -> ! {
    panic!("{future} polled after completion")
}

/// The `Idempotency-Key` header (IETF draft-ietf-httpapi-idempotency-key-header), read by the
/// server layer and stamped by the client layer.
pub const IDEMPOTENCY_KEY: http::HeaderName = http::HeaderName::from_static("idempotency-key");

/// The header an idempotency server adds, with the value `true`, to its "still in progress"
/// answers (HTTP `409`, gRPC `UNAVAILABLE`), so a client can tell them from other failures.
pub const IDEMPOTENCY_IN_PROGRESS: http::HeaderName =
    http::HeaderName::from_static("idempotency-in-progress");

/// The gRPC vocabulary every layer uses: recognising gRPC traffic, status codes, reading
/// `grpc-status` from headers or trailers, and building a trailers-only answer.
pub mod grpc;
