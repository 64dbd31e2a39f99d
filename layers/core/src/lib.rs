//! Pieces shared by tower-once's layers: a request/response body that may be held in memory,
//! and a bounded, copy-avoiding chunk collector.
//!
//! Users meet [`body::BufferedBody`] under the names the layers give it
//! (`tower_once_idempotency::{RequestBody, ResponseBody}`, `tower_once_retry::http::ReplayBody`);
//! this crate has no API stability of its own beyond theirs.

// Library code never unwraps: a panic on input is a bug (tests may).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod body;
