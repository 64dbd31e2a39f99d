//! How the relay classifies a sender's outcome: the retry crate's vocabulary (`Classify`,
//! `Action`, `HttpClassifier`, `RetryOnError`), re-exported, and the relay's default,
//! [`SendClassifier`].
//!
//! | action | the relay |
//! |---|---|
//! | `Success` | marks the row sent |
//! | `Retry { after }` | `attempts + 1`; the next attempt after `after` (the provider's `Retry-After`, at most a day) or the backoff |
//! | `Stop` | parks the row for a person |

pub use tower_once_retry::classify::{retry_after, Action, Classify, HttpClassifier, RetryOnError};

use std::any::Any;

/// The relay's default: `Ok` is sent; an error that carries the sender's own verdict (an
/// [`HttpSendError`](crate::http::HttpSendError), feature `http`, also when boxed or in a
/// boxed error's `source()` chain) is acted on as it says; any other error is retried.
///
/// For a sender that answers `Ok(response)` whatever the status (a hand-written one around an
/// HTTP client), use [`HttpClassifier`] instead; the ready-made
/// [`HttpSender`](crate::http::HttpSender) needs nothing.
///
/// ```
/// use tower_once_outbox::classify::{Action, Classify, SendClassifier};
///
/// assert_eq!(SendClassifier.classify(&Ok::<_, std::io::Error>(())), Action::Success);
/// let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
/// assert_eq!(SendClassifier.classify(&Err::<(), _>(refused)), Action::Retry { after: None });
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct SendClassifier;

impl<Res, E: 'static> Classify<Res, E> for SendClassifier {
    fn classify(&self, outcome: &Result<Res, E>) -> Action {
        match outcome {
            Ok(_) => Action::Success,
            Err(error) => carried(error).unwrap_or(Action::Retry { after: None }),
        }
    }
}

/// The verdict an error carries, if it is (or boxes, or is caused by) an `HttpSendError`.
#[cfg(feature = "http")]
fn carried(error: &dyn Any) -> Option<Action> {
    use crate::http::HttpSendError;
    type BoxError = Box<dyn std::error::Error + Send + Sync>;

    if let Some(sent) = error.downcast_ref::<HttpSendError>() {
        return Some(sent.action());
    }
    let boxed = error.downcast_ref::<BoxError>()?;
    tower_once_core::chain::find::<HttpSendError>(&**boxed).map(HttpSendError::action)
}

#[cfg(not(feature = "http"))]
fn carried(_error: &dyn Any) -> Option<Action> {
    None
}

#[cfg(all(test, feature = "http"))]
mod tests {
    use super::*;
    use crate::http::HttpSendError;
    use std::time::Duration;

    #[derive(Debug)]
    struct Wrapper(HttpSendError);
    impl std::fmt::Display for Wrapper {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("wrapped")
        }
    }
    impl std::error::Error for Wrapper {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    type BoxError = Box<dyn std::error::Error + Send + Sync>;

    fn refused() -> HttpSendError {
        HttpSendError::answered(
            http::StatusCode::BAD_REQUEST,
            Default::default(),
            Action::Stop,
        )
    }

    #[test]
    fn the_senders_verdict_is_found_directly_boxed_and_through_sources() {
        let classify = |e| SendClassifier.classify(&Err::<(), HttpSendError>(e));
        assert_eq!(classify(refused()), Action::Stop);
        let after = Some(Duration::from_secs(7));
        let busy = HttpSendError::answered(
            http::StatusCode::SERVICE_UNAVAILABLE,
            Default::default(),
            Action::Retry { after },
        );
        assert_eq!(classify(busy), Action::Retry { after });

        let boxed: BoxError = Box::new(refused());
        assert_eq!(SendClassifier.classify(&Err::<(), _>(boxed)), Action::Stop);
        let wrapped: BoxError = Box::new(Wrapper(refused()));
        assert_eq!(
            SendClassifier.classify(&Err::<(), _>(wrapped)),
            Action::Stop
        );

        let other: BoxError = "reset".into();
        assert_eq!(
            SendClassifier.classify(&Err::<(), _>(other)),
            Action::Retry { after: None }
        );
        assert_eq!(
            SendClassifier.classify(&Err::<(), _>(Wrapper(refused()))),
            Action::Retry { after: None },
            "an error type of its own hides the verdict (documented)"
        );
    }
}
