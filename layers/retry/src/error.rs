use std::error::Error as StdError;
use std::fmt;

/// Why the layer stopped retrying.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum GiveUp {
    /// The attempt limit was reached.
    Exhausted,
    /// The next wait would end past the operation's deadline.
    Deadline,
    /// The retry budget refused another retry.
    Budget,
    /// The classifier said the outcome is final (or the request was not retried at all).
    NotRetryable,
}

impl GiveUp {
    /// A stable lowercase name: `exhausted`, `deadline`, `budget`, `not_retryable`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Exhausted => "exhausted",
            Self::Deadline => "deadline",
            Self::Budget => "budget",
            Self::NotRetryable => "not_retryable",
        }
    }
}

impl fmt::Display for GiveUp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The error of a [`Retry`](crate::Retry)-wrapped service: the last attempt's error, with why
/// the layer stopped and how many attempts were made. The inner error keeps its type
/// ([`get_inner`](Self::get_inner), [`into_inner`](Self::into_inner)) and is the
/// [`source`](StdError::source).
///
/// When the last outcome was a response (a `503`, say), giving up returns that response as
/// `Ok`, not an error.
///
/// ```
/// use tower_once_retry::{GiveUp, RetryError};
///
/// let err = RetryError::new(GiveUp::Exhausted, 4, std::io::Error::other("reset"));
/// assert_eq!(err.reason(), GiveUp::Exhausted);
/// assert_eq!(err.attempts(), 4);
/// assert_eq!(err.to_string(), "gave up after 4 attempts (exhausted): reset");
/// assert!(std::error::Error::source(&err).is_some());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryError<E> {
    reason: GiveUp,
    attempts: u32,
    inner: E,
}

impl<E> RetryError<E> {
    /// An error after `attempts` attempts, for `reason`, with the last attempt's error.
    pub const fn new(reason: GiveUp, attempts: u32, inner: E) -> Self {
        Self {
            reason,
            attempts,
            inner,
        }
    }

    /// Why the layer stopped.
    pub const fn reason(&self) -> GiveUp {
        self.reason
    }

    /// How many attempts were made.
    pub const fn attempts(&self) -> u32 {
        self.attempts
    }

    /// The last attempt's error.
    pub const fn get_inner(&self) -> &E {
        &self.inner
    }

    /// The last attempt's error, consuming this one.
    pub fn into_inner(self) -> E {
        self.inner
    }
}

impl<E: fmt::Display> fmt::Display for RetryError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = if self.attempts == 1 { "" } else { "s" };
        write!(
            f,
            "gave up after {} attempt{s} ({}): {}",
            self.attempts, self.reason, self.inner
        )
    }
}

impl<E: StdError + 'static> StdError for RetryError<E> {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&self.inner)
    }
}
