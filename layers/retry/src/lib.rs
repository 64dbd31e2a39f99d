//! The `RetryLayer` of tower-once: not implemented yet.
//!
//! This crate reserves the name and its place in the workspace. The layer it will hold
//! (classified, budgeted, deadline-bound retries with replayable bodies) is specified in the
//! project's design notes and tracked as an open issue; nothing here is usable today.
