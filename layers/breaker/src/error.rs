use crate::CircuitState;
use std::error::Error as StdError;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;
use tower_once_core::attempt::Refused;
use tower_once_core::unsent::Unsent;

/// A circuit refused a call: it is open (or isolated, or half-open with every probe taken), so
/// the call was never sent.
///
/// ```
/// use std::time::Duration;
/// use tower_once_breaker::{CircuitOpen, CircuitState};
///
/// let open = CircuitOpen::new("https://api.example.com", CircuitState::Open, Some(Duration::from_secs(4)));
/// assert_eq!(open.retry_after(), Some(Duration::from_secs(4)));
/// assert_eq!(
///     open.to_string(),
///     "circuit https://api.example.com is open: a probe is admitted in 4.0 s"
/// );
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CircuitOpen {
    circuit: Arc<str>,
    state: CircuitState,
    refused: Refused,
}

impl CircuitOpen {
    /// A refusal by the circuit `circuit` in `state`, which admits a probe after `retry_after`
    /// when that is known.
    pub fn new(
        circuit: impl Into<Arc<str>>,
        state: CircuitState,
        retry_after: Option<Duration>,
    ) -> Self {
        Self {
            circuit: circuit.into(),
            state,
            refused: Refused::new(retry_after),
        }
    }

    /// The circuit's key (`""` for the layer's default circuit).
    pub fn circuit(&self) -> &str {
        &self.circuit
    }

    /// The circuit's state when it refused.
    pub const fn state(&self) -> CircuitState {
        self.state
    }

    /// How long until the circuit admits a probe: known when it is open; `None` when it is
    /// isolated (until someone closes it) or half-open with every probe taken (until a probe
    /// decides).
    pub const fn retry_after(&self) -> Option<Duration> {
        self.refused.retry_after()
    }

    /// The refusal as the retry layer sees it.
    pub(crate) const fn refused(&self) -> Refused {
        self.refused
    }
}

impl fmt::Display for CircuitOpen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = if self.circuit.is_empty() {
            "the circuit"
        } else {
            "circuit "
        };
        write!(f, "{name}{} is {}", self.circuit, self.state)?;
        match (self.state, self.retry_after()) {
            (_, Some(after)) => {
                let ms = after.as_millis();
                write!(
                    f,
                    ": a probe is admitted in {}.{} s",
                    ms / 1000,
                    (ms % 1000) / 100
                )
            }
            (CircuitState::Isolated, None) => f.write_str(": isolated by hand"),
            (CircuitState::HalfOpen, None) => f.write_str(": every probe is taken"),
            _ => Ok(()),
        }
    }
}

impl StdError for CircuitOpen {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        // The refusal: what the retry layer and the fallback look for in an error's chain.
        Some(&self.refused)
    }
}

impl Unsent for CircuitOpen {
    fn is_unsent(&self) -> bool {
        true
    }
}

/// The error of a [`CircuitBreaker`](crate::CircuitBreaker)-wrapped service: the circuit
/// refused the call ([`is_circuit_open`](Self::is_circuit_open)), or the inner service failed with its own,
/// typed, error.
///
/// ```
/// use tower_once_breaker::{BreakerError, CircuitOpen, CircuitState};
///
/// let inner: BreakerError<std::io::Error> = BreakerError::inner(std::io::Error::other("reset"));
/// assert!(!inner.is_circuit_open() && inner.get_inner().is_some());
///
/// let refused: BreakerError<std::io::Error> = CircuitOpen::new("db", CircuitState::Isolated, None).into();
/// assert!(refused.is_circuit_open() && refused.circuit_retry_after().is_none());
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct BreakerError<E> {
    kind: Kind<E>,
}

#[derive(Clone, PartialEq, Eq)]
enum Kind<E> {
    Open(CircuitOpen),
    Inner(E),
}

impl<E> BreakerError<E> {
    /// Wraps the inner service's error.
    pub const fn inner(error: E) -> Self {
        Self {
            kind: Kind::Inner(error),
        }
    }

    /// Whether the circuit refused the call (which was then never sent).
    pub const fn is_circuit_open(&self) -> bool {
        matches!(self.kind, Kind::Open(_))
    }

    /// The refusal, if the circuit refused the call.
    pub const fn open(&self) -> Option<&CircuitOpen> {
        match &self.kind {
            Kind::Open(open) => Some(open),
            Kind::Inner(_) => None,
        }
    }

    /// How long until the refusing circuit admits a probe, when it refused and knows.
    pub const fn circuit_retry_after(&self) -> Option<Duration> {
        match &self.kind {
            Kind::Open(open) => open.retry_after(),
            Kind::Inner(_) => None,
        }
    }

    /// The inner service's error, if that is what failed.
    pub const fn get_inner(&self) -> Option<&E> {
        match &self.kind {
            Kind::Inner(e) => Some(e),
            Kind::Open(_) => None,
        }
    }

    /// The inner service's error, or this error when the circuit refused the call.
    pub fn into_inner(self) -> Result<E, Self> {
        match self.kind {
            Kind::Inner(e) => Ok(e),
            Kind::Open(_) => Err(self),
        }
    }
}

impl<E> From<CircuitOpen> for BreakerError<E> {
    fn from(open: CircuitOpen) -> Self {
        Self {
            kind: Kind::Open(open),
        }
    }
}

impl<E: fmt::Debug> fmt::Debug for BreakerError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Open(open) => f.debug_tuple("BreakerError::Open").field(open).finish(),
            Kind::Inner(e) => f.debug_tuple("BreakerError::Inner").field(e).finish(),
        }
    }
}

impl<E: fmt::Display> fmt::Display for BreakerError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Open(open) => open.fmt(f),
            Kind::Inner(e) => e.fmt(f),
        }
    }
}

impl<E: StdError + 'static> StdError for BreakerError<E> {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        match &self.kind {
            Kind::Open(open) => Some(open),
            Kind::Inner(e) => Some(e),
        }
    }
}

/// Refused calls were never sent; the inner error answers for itself.
impl<E: Unsent> Unsent for BreakerError<E> {
    fn is_unsent(&self) -> bool {
        match &self.kind {
            Kind::Open(_) => true,
            Kind::Inner(e) => e.is_unsent(),
        }
    }
}
