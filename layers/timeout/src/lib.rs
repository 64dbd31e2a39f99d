//! The deadline-aware `TimeoutLayer` of tower-once: not implemented yet.
//!
//! This crate reserves the name and its place in the workspace. The layer it will hold (a
//! per-attempt cap that respects the remaining retry deadline) is tracked as an open issue;
//! nothing here is usable today.
