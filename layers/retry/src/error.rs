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

/// The error of a [`Retry`](crate::Retry)-wrapped service: why the layer stopped, how many
/// attempts were made, and the last attempt's error when there was one. The inner error keeps
/// its type ([`get_inner`](Self::get_inner), [`into_inner`](Self::into_inner)) and is the
/// [`source`](StdError::source).
///
/// When the last outcome was a response (a `503`, say), giving up returns that response as
/// `Ok`, not an error. When the operation's deadline passes while an attempt is still running,
/// the layer ends the operation itself: the error then has no inner error and
/// [`is_deadline`](Self::is_deadline) is true.
///
/// ```
/// use tower_once_retry::{GiveUp, RetryError};
///
/// let err = RetryError::new(GiveUp::Exhausted, 4, std::io::Error::other("reset"));
/// assert_eq!(err.reason(), GiveUp::Exhausted);
/// assert_eq!(err.attempts(), 4);
/// assert_eq!(err.to_string(), "gave up after 4 attempts (exhausted): reset");
/// assert!(std::error::Error::source(&err).is_some());
///
/// let late = RetryError::<std::io::Error>::deadline(2);
/// assert!(late.is_deadline() && late.get_inner().is_none());
/// assert_eq!(late.to_string(), "gave up after 2 attempts (deadline): the deadline passed");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryError<E> {
    reason: GiveUp,
    attempts: u32,
    inner: Option<E>,
}

impl<E> RetryError<E> {
    /// The error of an operation that stopped for `reason` after `attempts`, the last of
    /// which failed with `inner`.
    pub const fn new(reason: GiveUp, attempts: u32, inner: E) -> Self {
        Self {
            reason,
            attempts,
            inner: Some(inner),
        }
    }

    /// The error of an operation whose deadline passed while attempt number `attempts` was
    /// still running (or waiting for the service to be ready).
    pub const fn deadline(attempts: u32) -> Self {
        Self {
            reason: GiveUp::Deadline,
            attempts,
            inner: None,
        }
    }

    /// Why the layer stopped.
    pub const fn reason(&self) -> GiveUp {
        self.reason
    }

    /// How many attempts were made (started), the last included.
    pub const fn attempts(&self) -> u32 {
        self.attempts
    }

    /// Whether the operation ran out of time (its deadline passed, or the next wait would end
    /// after it).
    pub const fn is_deadline(&self) -> bool {
        matches!(self.reason, GiveUp::Deadline)
    }

    /// The last attempt's error; `None` when the deadline cut an attempt short.
    pub const fn get_inner(&self) -> Option<&E> {
        self.inner.as_ref()
    }

    /// The last attempt's error, or this error when there is none.
    pub fn into_inner(self) -> Result<E, Self> {
        match self.inner {
            Some(inner) => Ok(inner),
            None => Err(self),
        }
    }
}

impl<E: fmt::Display> fmt::Display for RetryError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = if self.attempts == 1 { "" } else { "s" };
        write!(
            f,
            "gave up after {} attempt{s} ({}): ",
            self.attempts, self.reason
        )?;
        match &self.inner {
            Some(inner) => write!(f, "{inner}"),
            None => f.write_str("the deadline passed"),
        }
    }
}

impl<E: StdError + 'static> StdError for RetryError<E> {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.inner.as_ref().map(|e| e as &(dyn StdError + 'static))
    }
}
