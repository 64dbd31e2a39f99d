//! HTTP and gRPC timeouts: [`HttpTimeoutLayer`] for clients (hyper, tonic channels) and
//! [`ServerTimeoutLayer`] for servers (axum, tonic).
//!
//! | | [`TimeoutLayer`](crate::TimeoutLayer) | [`HttpTimeoutLayer`] | [`ServerTimeoutLayer`] |
//! |---|---|---|---|
//! | requests | any [`Carrier`](crate::Carrier) | `http::Request` | `http::Request` |
//! | deadline read from | scope (call and polls), extension (carriers) | scope (call and polls) and extension | call scope, extension, `grpc-timeout` (opt-in) |
//! | on expiry | `Err(TimeoutError)` | `Err(TimeoutError)` | status response (`503`), or `grpc-status: 4` |
//! | response body covered | n/a | opt-in | opt-in |
//! | time left sent downstream | scope, extension (carriers) | scope, extension, `grpc-timeout` or a header (opt-in) | scope, extension for the handler |

mod body;
pub mod client;
pub mod server;

pub use self::body::TimeoutBody;
pub use self::client::{HttpTimeout, HttpTimeoutLayer};
pub use self::server::{ServerTimeout, ServerTimeoutLayer};
