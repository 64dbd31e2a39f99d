//! The one error of a [`Client`](super::Client).

use crate::RetryError;
use std::error::Error as StdError;
use std::fmt;
use std::time::Duration;
use tower_once_timeout::TimeoutError;

/// What the stack of a [`Client`](super::Client) fails with.
pub(super) type StackError = RetryError<TimeoutError<reqwest::Error>>;

/// Why a request sent by a [`Client`](super::Client) got no response: it could not be built,
/// it timed out, the deadline passed, the server was still running it, or the last attempt
/// failed (reqwest's error inside).
///
/// ```
/// # fn f(error: tower_once_retry::reqwest::Error) {
/// if error.is_deadline() && error.may_have_executed() {
///     // The operation may still complete: fetch its result later with the same key.
///     println!("retry later with {:?}", error.idempotency_key());
/// } else if let Some(reqwest) = error.reqwest() {
///     println!("transport: {reqwest} (connect: {})", reqwest.is_connect());
/// }
/// # }
/// ```
pub struct Error {
    kind: Kind,
}

enum Kind {
    Build(reqwest::Error),
    Stack(StackError),
}

impl Error {
    pub(super) fn build(error: reqwest::Error) -> Self {
        Self {
            kind: Kind::Build(error),
        }
    }

    pub(super) fn stack(error: StackError) -> Self {
        Self {
            kind: Kind::Stack(error),
        }
    }

    /// Whether reqwest could not build the request (a bad URL, a body that failed to encode).
    pub fn is_builder(&self) -> bool {
        matches!(self.kind, Kind::Build(_))
    }

    /// Whether time ran out: an attempt's timeout, the deadline, or reqwest's own timeout.
    pub fn is_elapsed(&self) -> bool {
        match &self.kind {
            Kind::Build(_) => false,
            Kind::Stack(e) => {
                e.is_deadline()
                    || e.get_inner().is_some_and(|t| {
                        t.is_elapsed() || t.get_inner().is_some_and(reqwest::Error::is_timeout)
                    })
            }
        }
    }

    /// Whether the operation's deadline (over all attempts and waits) passed.
    pub fn is_deadline(&self) -> bool {
        match &self.kind {
            Kind::Build(_) => false,
            Kind::Stack(e) => {
                e.is_deadline()
                    || e.get_inner()
                        .and_then(TimeoutError::elapsed)
                        .is_some_and(|elapsed| elapsed.is_deadline())
            }
        }
    }

    /// Whether the server said it was still running the request when the client gave up (an
    /// idempotency server's `409` in progress): it may still complete.
    pub fn is_in_progress(&self) -> bool {
        self.retry().is_some_and(RetryError::is_in_progress)
    }

    /// Whether the request may have had its effect although no response came: the deadline or
    /// a timeout cut an attempt that was running, or the server was still running it.
    pub fn may_have_executed(&self) -> bool {
        self.retry().is_some_and(|e| {
            e.may_have_executed() || e.get_inner().is_some_and(TimeoutError::is_elapsed)
        })
    }

    /// How many attempts were made (0 when the request could not be built).
    pub fn attempts(&self) -> u32 {
        self.retry().map_or(0, RetryError::attempts)
    }

    /// How long the operation ran.
    pub fn elapsed(&self) -> Duration {
        self.retry().map_or(Duration::ZERO, RetryError::elapsed)
    }

    /// The `Idempotency-Key` every attempt carried, to fetch the result of a request that may
    /// still complete.
    pub fn idempotency_key(&self) -> Option<&str> {
        self.retry().and_then(RetryError::idempotency_key)
    }

    /// reqwest's error: the build error, or the last attempt's transport error.
    pub fn reqwest(&self) -> Option<&reqwest::Error> {
        match &self.kind {
            Kind::Build(e) => Some(e),
            Kind::Stack(e) => e.get_inner().and_then(TimeoutError::get_inner),
        }
    }

    /// The retry layer's error, when the request was sent.
    pub fn retry(&self) -> Option<&RetryError<TimeoutError<reqwest::Error>>> {
        match &self.kind {
            Kind::Stack(e) => Some(e),
            Kind::Build(_) => None,
        }
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Build(e) => f.debug_tuple("Error::Build").field(e).finish(),
            Kind::Stack(e) => f.debug_tuple("Error::Send").field(e).finish(),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Build(e) => write!(f, "could not build the request: {e}"),
            Kind::Stack(e) => e.fmt(f),
        }
    }
}

impl StdError for Error {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        match &self.kind {
            Kind::Build(e) => Some(e),
            Kind::Stack(e) => Some(e),
        }
    }
}

/// Unsent when reqwest could not build the request, or no attempt reached the server (see
/// [`RetryError`]'s answer; reqwest's connect errors are unsent).
impl tower_once_core::unsent::Unsent for Error {
    fn is_unsent(&self) -> bool {
        match &self.kind {
            Kind::Build(_) => true,
            Kind::Stack(e) => e.is_unsent(),
        }
    }
}
