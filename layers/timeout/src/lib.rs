//! The deadline-aware `TimeoutLayer` of tower-once: not implemented yet.
//!
//! This crate reserves the name and its place in the workspace. The layer it will hold (a
//! per-attempt cap that respects the remaining retry deadline) is tracked as an open issue;
//! nothing here is usable today.

// Library code never unwraps: a panic on input is a bug (tests may).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]
