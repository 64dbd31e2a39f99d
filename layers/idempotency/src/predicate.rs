//! Which responses are stored for replay, and which release the key so a retry runs again.
//!
//! | response                                   | default decision |
//! |--------------------------------------------|------------------|
//! | 2xx, 3xx                                   | store            |
//! | 4xx except 408, 425, 429                   | store            |
//! | 408 Request Timeout, 425 Too Early, 429 Too Many Requests | release |
//! | 5xx                                        | release          |
//! | inner service error, future dropped        | release (always) |
//!
//! A stored 4xx means "this request is wrong": retrying it unchanged cannot succeed, and replaying
//! the same answer is what the IETF draft and Stripe do. 408, 425 and 429 say "not now", so the
//! client's retry should run. Replace the rule with
//! [`IdempotencyLayer::store_when`](crate::IdempotencyLayer::store_when); any
//! `Fn(&http::response::Parts) -> bool` is a [`StorePredicate`].

use http::response::Parts;
use http::StatusCode;

/// Decides whether a response is stored (`true`) or its key released (`false`).
///
/// ```
/// use tower_once_idempotency::predicate::{DefaultPredicate, StorePredicate};
///
/// let parts = |status: u16| {
///     let mut res = http::Response::new(());
///     *res.status_mut() = http::StatusCode::from_u16(status).unwrap();
///     res.into_parts().0
/// };
/// assert!(DefaultPredicate.should_store(&parts(201)));
/// assert!(DefaultPredicate.should_store(&parts(400)));
/// assert!(!DefaultPredicate.should_store(&parts(429)));
/// assert!(!DefaultPredicate.should_store(&parts(503)));
///
/// // Store only successes: a 4xx releases the key too.
/// let only_success = |parts: &http::response::Parts| parts.status.is_success();
/// assert!(!only_success.should_store(&parts(400)));
/// ```
pub trait StorePredicate {
    /// Whether the response with these parts is stored for replay.
    fn should_store(&self, parts: &Parts) -> bool;
}

impl<F> StorePredicate for F
where
    F: Fn(&Parts) -> bool,
{
    fn should_store(&self, parts: &Parts) -> bool {
        self(parts)
    }
}

/// The default rule: see the [module docs](self).
#[derive(Debug, Clone, Copy, Default)]
pub struct DefaultPredicate;

impl StorePredicate for DefaultPredicate {
    fn should_store(&self, parts: &Parts) -> bool {
        let status = parts.status;
        !(status.is_server_error()
            || status == StatusCode::REQUEST_TIMEOUT
            || status.as_u16() == 425
            || status == StatusCode::TOO_MANY_REQUESTS)
    }
}
