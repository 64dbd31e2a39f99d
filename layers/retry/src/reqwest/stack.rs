//! The stack behind a [`Client`](super::Client), with its classifier and hook types erased.

use super::error::StackError;
use tower::util::BoxCloneSyncService;
use tower_once_timeout::http::TimeoutBody;

/// What the stack answers before the response is handed back as a `reqwest::Response`.
pub(super) type StackResponse = http::Response<TimeoutBody<reqwest::Body>>;

/// The stack, with its classifier and hook types erased so that [`Client`](super::Client)
/// has none.
pub(super) type Stack =
    BoxCloneSyncService<http::Request<reqwest::Body>, StackResponse, StackError>;
