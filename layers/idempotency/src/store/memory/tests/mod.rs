//! The `MemoryStore`'s own tests, by subject: its bounds, claims and tokens, expiry, fairness
//! between scopes, the rankings that decide who pays, the cost of an operation, and random
//! sequences checked against a model. `support.rs` holds what they share.

mod bounds;
mod claims;
mod cost;
mod evictions;
mod expiry;
mod fairness;
mod model;
mod rankings;
mod reference;
mod support;
