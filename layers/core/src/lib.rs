//! Pieces shared by tower-once's layers: a request/response body that may be held in memory,
//! a bounded, copy-avoiding chunk collector, and how gRPC traffic is recognised.
//!
//! Users meet [`body::BufferedBody`] under the names the layers give it
//! (`tower_once_idempotency::{RequestBody, ResponseBody}`, `tower_once_retry::http::ReplayBody`);
//! this crate has no API stability of its own beyond theirs.

// Feature-gated items show their feature on docs.rs.
#![cfg_attr(docsrs, feature(doc_cfg))]
// Library code never unwraps: a panic on input is a bug (tests may).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod body;
pub mod carrier;
pub mod outage;
pub mod slots;
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
