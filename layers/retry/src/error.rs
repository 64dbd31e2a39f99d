use std::error::Error as StdError;
use std::fmt;
use std::time::Duration;

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
    /// A circuit breaker below refused the last attempt, and admits no new try before the
    /// deadline.
    CircuitOpen,
}

impl GiveUp {
    /// A stable lowercase name: `exhausted`, `deadline`, `budget`, `not_retryable`,
    /// `circuit_open`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Exhausted => "exhausted",
            Self::Deadline => "deadline",
            Self::Budget => "budget",
            Self::NotRetryable => "not_retryable",
            Self::CircuitOpen => "circuit_open",
        }
    }
}

impl fmt::Display for GiveUp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The error of a [`Retry`](crate::Retry)-wrapped service: why the layer stopped, how many
/// attempts were made and how long it took, and the last attempt's error when there was one.
/// The inner error keeps its type ([`get_inner`](Self::get_inner),
/// [`into_inner`](Self::into_inner)) and is the [`source`](StdError::source).
///
/// When the last outcome was a response (a `503`, say), giving up returns that response as
/// `Ok`, not an error. The error has no inner error when the layer ended the operation itself:
///
/// - the deadline passed while an attempt was still running, or before one could start
///   ([`is_deadline`](Self::is_deadline)); an attempt that was running **may still complete**
///   ([`may_have_executed`](Self::may_have_executed));
/// - the server said the operation is still running (an idempotency server's "in progress")
///   and the layer ran out of time, attempts or budget before it finished
///   ([`is_in_progress`](Self::is_in_progress)): the operation may still complete, and the
///   same request with the same [`idempotency_key`](Self::idempotency_key) fetches its result
///   later.
///
/// ```
/// use std::time::Duration;
/// use tower_once_retry::{GiveUp, RetryError};
///
/// let err = RetryError::new(GiveUp::Exhausted, 4, std::io::Error::other("reset"));
/// assert_eq!(err.reason(), GiveUp::Exhausted);
/// assert_eq!(err.attempts(), 4);
/// assert_eq!(err.to_string(), "gave up after 4 attempts (exhausted): reset");
/// assert!(std::error::Error::source(&err).is_some());
///
/// let late = RetryError::<std::io::Error>::deadline(2).with_elapsed(Duration::from_millis(1500));
/// assert!(late.is_deadline() && late.get_inner().is_none() && late.may_have_executed());
/// assert_eq!(
///     late.to_string(),
///     "the deadline passed after 1.5 s, during attempt 2; the operation may still complete"
/// );
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryError<E> {
    reason: GiveUp,
    attempts: u32,
    inner: Option<E>,
    elapsed: Duration,
    in_progress: bool,
    // The last attempt failed at the deadline (an inner timeout cut it): it may still complete.
    cut: bool,
    key: Option<String>,
    // Attempts a circuit breaker below refused before sending them.
    refusals: u32,
    // Whether every attempt before the last was one of them.
    earlier_refused: bool,
    // The last attempt's refusal, when it was one.
    last_refusal: Option<tower_once_core::attempt::Refused>,
}

impl<E> RetryError<E> {
    /// The error of an operation that stopped for `reason` after `attempts`, the last of
    /// which failed with `inner`.
    ///
    /// The constructors and `with_*` methods are the layers' own (and tests'): not part of the
    /// stable API.
    #[doc(hidden)]
    pub const fn new(reason: GiveUp, attempts: u32, inner: E) -> Self {
        Self {
            reason,
            attempts,
            inner: Some(inner),
            elapsed: Duration::ZERO,
            in_progress: false,
            cut: false,
            key: None,
            refusals: 0,
            earlier_refused: false,
            last_refusal: None,
        }
    }

    /// The error of an operation whose deadline passed while attempt number `attempts` was
    /// still running (or waiting for the service to be ready); `0` when it passed before the
    /// first attempt.
    #[doc(hidden)]
    pub const fn deadline(attempts: u32) -> Self {
        Self {
            reason: GiveUp::Deadline,
            attempts,
            inner: None,
            elapsed: Duration::ZERO,
            in_progress: false,
            cut: false,
            key: None,
            refusals: 0,
            earlier_refused: false,
            last_refusal: None,
        }
    }

    /// The error of an operation that stopped for `reason` after `attempts` while the server
    /// said it was still running it.
    #[doc(hidden)]
    pub const fn in_progress(reason: GiveUp, attempts: u32) -> Self {
        Self {
            reason,
            attempts,
            inner: None,
            elapsed: Duration::ZERO,
            in_progress: true,
            cut: false,
            key: None,
            refusals: 0,
            earlier_refused: false,
            last_refusal: None,
        }
    }

    /// The same error, saying the operation took `elapsed`.
    #[doc(hidden)]
    pub const fn with_elapsed(mut self, elapsed: Duration) -> Self {
        self.elapsed = elapsed;
        self
    }

    /// The same error, saying the last attempt failed at the deadline (an inner timeout cut
    /// it) after it was sent: it may still complete.
    #[doc(hidden)]
    pub const fn cut_at_deadline(mut self) -> Self {
        self.cut = true;
        self
    }

    /// The same error, saying how many of its attempts a circuit breaker below refused
    /// before sending them, and whether every attempt before the last was one of them.
    pub(crate) const fn with_refusals(
        mut self,
        refusals: u32,
        earlier_refused: bool,
        last_refusal: Option<tower_once_core::attempt::Refused>,
    ) -> Self {
        self.refusals = refusals;
        self.earlier_refused = earlier_refused;
        self.last_refusal = last_refusal;
        self
    }

    /// The same error, carrying the idempotency key every attempt was sent with.
    #[doc(hidden)]
    pub fn with_idempotency_key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// Why the layer stopped.
    pub const fn reason(&self) -> GiveUp {
        self.reason
    }

    /// How many attempts were made (started), the last included.
    pub const fn attempts(&self) -> u32 {
        self.attempts
    }

    /// How long the operation ran, from its call to the give-up (zero when not measured).
    pub const fn elapsed(&self) -> Duration {
        self.elapsed
    }

    /// Whether the operation ran out of time (its deadline passed, or the next wait would end
    /// after it).
    pub const fn is_deadline(&self) -> bool {
        matches!(self.reason, GiveUp::Deadline)
    }

    /// Whether the operation ended on a refusal by a circuit breaker below: the last attempt
    /// was refused, never sent, whatever the reason the layer gave up for
    /// ([`GiveUp::CircuitOpen`]: no new try is admitted before the deadline; or the attempts
    /// ran out).
    pub const fn is_circuit_open(&self) -> bool {
        matches!(self.reason, GiveUp::CircuitOpen) || self.last_refusal.is_some()
    }

    /// When the last attempt was refused by a circuit breaker below: how long from then until
    /// the circuit admits a probe, when it said.
    pub const fn circuit_retry_after(&self) -> Option<Duration> {
        match self.last_refusal {
            Some(refused) => refused.retry_after(),
            None => None,
        }
    }

    /// How many attempts a circuit breaker below refused before sending them: those never
    /// reached the dependency.
    pub const fn refusals(&self) -> u32 {
        self.refusals
    }

    /// Whether the server said the operation was still running when the layer gave up: it may
    /// still complete; send the same request with the same
    /// [`idempotency_key`](Self::idempotency_key) later to fetch its result.
    pub const fn is_in_progress(&self) -> bool {
        self.in_progress
    }

    /// Whether the operation may have had its effect although the caller got no answer: the
    /// deadline cut an attempt that was running (the layer itself, or a timeout below it at the
    /// deadline), or the server said it was still running.
    pub const fn may_have_executed(&self) -> bool {
        self.in_progress || self.cut || (self.inner.is_none() && self.attempts > 0)
    }

    /// The `Idempotency-Key` the attempts carried (stamped or the caller's), when the HTTP
    /// form sent one: the handle to fetch the result of an operation that may still complete.
    pub fn idempotency_key(&self) -> Option<&str> {
        self.key.as_deref()
    }

    /// The last attempt's error; `None` when the layer ended the operation itself (see the
    /// type's docs).
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

/// `1.5 s`, `250 ms`: a duration as people read it.
struct Human(Duration);

impl fmt::Display for Human {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.0.as_millis();
        if ms < 1000 {
            write!(f, "{ms} ms")
        } else {
            // Tenths of a second, rounded down: enough to read a deadline by.
            write!(f, "{}.{} s", ms / 1000, (ms % 1000) / 100)
        }
    }
}

impl<E> RetryError<E> {
    /// What happened, without the inner error: how many attempts, how long, and whether the
    /// operation may still complete.
    pub(crate) fn outline(&self) -> Outline<'_, E> {
        Outline(self)
    }
}

/// [`RetryError::outline`].
pub(crate) struct Outline<'a, E>(&'a RetryError<E>);

impl<E> fmt::Display for Outline<'_, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let e = self.0;
        let s = if e.attempts == 1 { "" } else { "s" };
        if e.in_progress {
            write!(
                f,
                "gave up after {} attempt{s} ({}) in {}: the server was still running the operation, which may still complete",
                e.attempts,
                e.reason,
                Human(e.elapsed)
            )?;
        } else if e.inner.is_some() {
            write!(f, "gave up after {} attempt{s}", e.attempts)?;
            if !e.elapsed.is_zero() {
                write!(f, " in {}", Human(e.elapsed))?;
            }
            write!(f, " ({})", e.reason)?;
            if e.cut {
                f.write_str(
                    ", the last one cut at the deadline: the operation may still complete",
                )?;
            }
        } else if e.attempts == 0 {
            return write!(
                f,
                "the deadline passed after {}, before the first attempt",
                Human(e.elapsed)
            );
        } else {
            write!(
                f,
                "the deadline passed after {}, during attempt {}; the operation may still complete",
                Human(e.elapsed),
                e.attempts
            )?;
        }
        match (&e.key, e.may_have_executed()) {
            (Some(key), true) => write!(f, "; Idempotency-Key {key:?} fetches its result"),
            _ => Ok(()),
        }
    }
}

impl<E: fmt::Display> fmt::Display for RetryError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.outline())?;
        match &self.inner {
            Some(inner) => write!(f, ": {inner}"),
            None => Ok(()),
        }
    }
}

impl<E: StdError + 'static> StdError for RetryError<E> {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.inner.as_ref().map(|e| e as &(dyn StdError + 'static))
    }
}

/// No attempt reached the dependency: there was none, or every attempt before the last was
/// refused by a circuit breaker below and the last one's error says it was not sent. Anything
/// else may have run (an earlier attempt that failed unsent cannot be told apart here).
impl<E: tower_once_core::unsent::Unsent> tower_once_core::unsent::Unsent for RetryError<E> {
    fn is_unsent(&self) -> bool {
        self.attempts == 0
            || ((self.attempts == 1 || self.earlier_refused)
                && self
                    .inner
                    .as_ref()
                    .is_some_and(tower_once_core::unsent::Unsent::is_unsent))
    }
}
