//! Deciding what an outcome means: done, worth another attempt (perhaps after a delay the server
//! asked for), or final.
//!
//! The vocabulary ([`Action`], [`Classify`]) and the default classifiers ([`RetryOnError`],
//! [`HttpClassifier`], with the table of what it retries) are shared by every tower-once layer:
//! they live in [`tower_once_core::classify`] and are re-exported here, so one classifier serves
//! the retry layer, the circuit breaker, the fallback, the hedging layer and the worker.
//!
//! ```
//! use tower_once_retry::classify::{Action, Classify, HttpClassifier};
//!
//! let unavailable = http::Response::builder().status(503).body(()).unwrap();
//! assert_eq!(HttpClassifier.classify(&Ok::<_, ()>(unavailable)), Action::Retry { after: None });
//! ```

pub use tower_once_core::classify::{
    retry_after, says_in_progress, Action, Classify, HttpClassifier, RetryOnError,
};

use http::Response;

/// The classifier an [`HttpRetry`](../http/struct.HttpRetry.html) uses: the one chosen with
/// [`RetryLayer::classify`](crate::RetryLayer::classify), or [`HttpClassifier`] when none was
/// chosen — so `RetryLayer::new().into_http()` retries a `503` as an HTTP client expects. A
/// chosen classifier that retries a response marked `Idempotency-In-Progress: true` has it
/// treated as [`Action::InProgress`], so giving up on it is never the `409` as an answer.
#[derive(Debug, Clone, Copy)]
pub struct HttpDefault<C> {
    chosen: C,
    http: bool,
}

impl<C> HttpDefault<C> {
    pub(crate) const fn new(chosen: C, chosen_by_user: bool) -> Self {
        Self {
            chosen,
            http: !chosen_by_user,
        }
    }
}

impl<B, E, C> Classify<Response<B>, E> for HttpDefault<C>
where
    C: Classify<Response<B>, E>,
{
    fn classify(&self, outcome: &Result<Response<B>, E>) -> Action {
        if self.http {
            return HttpClassifier.classify(outcome);
        }
        // NOTE: an idempotency server's "in progress" answer is never the operation's answer,
        // whoever classifies: a chosen classifier that retries it makes it in progress.
        match (self.chosen.classify(outcome), outcome) {
            (Action::Retry { after }, Ok(response)) if says_in_progress(response.headers()) => {
                Action::InProgress { after }
            }
            (action, _) => action,
        }
    }
}
