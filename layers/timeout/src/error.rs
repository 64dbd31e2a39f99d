use std::error::Error as StdError;
use std::fmt;
use std::time::Duration;

/// A call did not finish in time.
///
/// It carries the limit that fired and whether that limit was the per-call cap or the remaining
/// operation deadline. `RetryLayer` retries it while time is left before the deadline; an
/// expiry at the deadline ([`is_deadline`](Self::is_deadline)) is never retried.
///
/// ```
/// use std::time::Duration;
/// use tower_once_timeout::Elapsed;
///
/// let e = Elapsed::new(Duration::from_millis(200), false);
/// assert_eq!(e.limit(), Duration::from_millis(200));
/// assert!(!e.is_deadline());
/// assert_eq!(e.to_string(), "timed out after 200ms (per-call limit)");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Elapsed {
    limit: Duration,
    deadline: bool,
}

impl Elapsed {
    /// An expiry after `limit`; `deadline` when the operation's deadline (not the per-call limit)
    /// was the smaller bound.
    pub const fn new(limit: Duration, deadline: bool) -> Self {
        Self { limit, deadline }
    }

    /// How long the call was allowed.
    pub const fn limit(&self) -> Duration {
        self.limit
    }

    /// Whether the operation's deadline, rather than the per-call limit, fired. A retry cannot
    /// help then: no time is left, and `RetryLayer` does not retry it.
    pub const fn is_deadline(&self) -> bool {
        self.deadline
    }
}

impl fmt::Display for Elapsed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let which = if self.deadline {
            "operation deadline"
        } else {
            "per-call limit"
        };
        write!(f, "timed out after {:?} ({which})", self.limit)
    }
}

impl StdError for Elapsed {}

impl Elapsed {
    /// Counts this expiry in `tower_once_timeout_timeouts_total{bound, layer}` (feature
    /// `metrics`); `layer` is `timeout`, `http_body` or `server`.
    pub(crate) fn record(&self, layer: &'static str) {
        crate::metrics::timed_out(self.deadline, layer);
    }
}

/// The error of a [`Timeout`](crate::Timeout)-wrapped service: either the call timed out, or
/// the inner service failed with its own, typed, error.
///
/// ```
/// use std::time::Duration;
/// use tower_once_timeout::{Elapsed, TimeoutError};
///
/// let inner: TimeoutError<std::io::Error> = TimeoutError::inner(std::io::Error::other("refused"));
/// assert!(!inner.is_elapsed());
/// assert!(inner.get_inner().is_some());
///
/// let late: TimeoutError<std::io::Error> = Elapsed::new(Duration::from_secs(1), true).into();
/// assert!(late.is_elapsed());
/// assert!(late.elapsed().is_some_and(|e| e.is_deadline()));
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct TimeoutError<E> {
    kind: Kind<E>,
}

#[derive(Clone, PartialEq, Eq)]
enum Kind<E> {
    Elapsed(Elapsed),
    Inner(E),
}

impl<E> TimeoutError<E> {
    /// Wraps the inner service's error.
    pub const fn inner(error: E) -> Self {
        Self {
            kind: Kind::Inner(error),
        }
    }

    /// Whether the call timed out.
    pub fn is_elapsed(&self) -> bool {
        matches!(self.kind, Kind::Elapsed(_))
    }

    /// The expiry, if the call timed out.
    pub fn elapsed(&self) -> Option<&Elapsed> {
        match &self.kind {
            Kind::Elapsed(e) => Some(e),
            Kind::Inner(_) => None,
        }
    }

    /// The inner service's error, if that is what failed.
    pub fn get_inner(&self) -> Option<&E> {
        match &self.kind {
            Kind::Inner(e) => Some(e),
            Kind::Elapsed(_) => None,
        }
    }

    /// The inner service's error, or the expiry.
    pub fn into_inner(self) -> Result<E, Elapsed> {
        match self.kind {
            Kind::Inner(e) => Ok(e),
            Kind::Elapsed(e) => Err(e),
        }
    }
}

impl<E> From<Elapsed> for TimeoutError<E> {
    fn from(elapsed: Elapsed) -> Self {
        Self {
            kind: Kind::Elapsed(elapsed),
        }
    }
}

impl<E: fmt::Debug> fmt::Debug for TimeoutError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Elapsed(e) => f.debug_tuple("TimeoutError::Elapsed").field(e).finish(),
            Kind::Inner(e) => f.debug_tuple("TimeoutError::Inner").field(e).finish(),
        }
    }
}

impl<E: fmt::Display> fmt::Display for TimeoutError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Elapsed(e) => fmt::Display::fmt(e, f),
            Kind::Inner(e) => fmt::Display::fmt(e, f),
        }
    }
}

impl<E: StdError + 'static> StdError for TimeoutError<E> {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        match &self.kind {
            Kind::Elapsed(e) => Some(e),
            Kind::Inner(e) => Some(e),
        }
    }
}

/// An expiry is never unsent: the call was under way.
impl tower_once_core::unsent::Unsent for Elapsed {
    fn is_unsent(&self) -> bool {
        false
    }
}

/// An expiry may have come after the request was sent; the inner error answers for itself.
impl<E: tower_once_core::unsent::Unsent> tower_once_core::unsent::Unsent for TimeoutError<E> {
    fn is_unsent(&self) -> bool {
        self.get_inner()
            .is_some_and(tower_once_core::unsent::Unsent::is_unsent)
    }
}
