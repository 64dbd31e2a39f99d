//! HTTP and gRPC timeouts: [`HttpTimeoutLayer`] for clients (hyper, tonic channels) and
//! [`ServerTimeoutLayer`] for servers (axum, tonic).
//!
//! | | [`TimeoutLayer`](crate::TimeoutLayer) | [`HttpTimeoutLayer`] | [`ServerTimeoutLayer`] |
//! |---|---|---|---|
//! | requests | any | `http::Request` | `http::Request` |
//! | deadline read from | call scope | call scope and extension | call scope, extension, `grpc-timeout` (opt-in) |
//! | on expiry | `Err(TimeoutError)` | `Err(TimeoutError)` | status response (`503`), or `grpc-status: 4` |
//! | response body covered | n/a | opt-in | opt-in |
//! | budget sent downstream | scope | scope, extension, `grpc-timeout` or a header (opt-in) | scope, extension for the handler |

mod body;
mod client;
mod server;

pub use self::body::TimeoutBody;
pub use self::client::{HttpTimeout, HttpTimeoutLayer, ResponseFuture};
pub use self::server::{ServerFuture, ServerTimeout, ServerTimeoutLayer};
