//! Store failures.

use std::error::Error as StdError;
use std::fmt;

/// A store could not carry out an operation.
///
/// ```
/// use tower_once_idempotency::store::StoreError;
///
/// let err = StoreError::unavailable(std::io::Error::other("connection refused"));
/// assert!(err.is_unavailable());
/// assert!(std::error::Error::source(&err).is_some());
/// assert_eq!(err.to_string(), "idempotency store unavailable: connection refused");
/// assert!(StoreError::full().is_full());
/// ```
#[derive(Debug)]
pub struct StoreError {
    kind: StoreErrorKind,
    source: Option<Box<dyn StdError + Send + Sync>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StoreErrorKind {
    Unavailable,
    Timeout,
    Full,
    Corrupt,
}

impl StoreError {
    /// The store could not be reached or answered with an error.
    pub fn unavailable(source: impl Into<Box<dyn StdError + Send + Sync>>) -> Self {
        Self {
            kind: StoreErrorKind::Unavailable,
            source: Some(source.into()),
        }
    }

    /// The store did not answer in time.
    pub fn timeout() -> Self {
        Self {
            kind: StoreErrorKind::Timeout,
            source: None,
        }
    }

    /// The store is at capacity and holds nothing it may evict.
    pub fn full() -> Self {
        Self {
            kind: StoreErrorKind::Full,
            source: None,
        }
    }

    /// The store returned a record it cannot decode.
    pub fn corrupt(source: impl Into<Box<dyn StdError + Send + Sync>>) -> Self {
        Self {
            kind: StoreErrorKind::Corrupt,
            source: Some(source.into()),
        }
    }

    /// Whether the store could not be reached.
    pub fn is_unavailable(&self) -> bool {
        self.kind == StoreErrorKind::Unavailable
    }

    /// Whether the store did not answer in time.
    pub fn is_elapsed(&self) -> bool {
        self.kind == StoreErrorKind::Timeout
    }

    /// Whether the store is full.
    pub fn is_full(&self) -> bool {
        self.kind == StoreErrorKind::Full
    }

    /// Whether the store returned an undecodable record.
    pub fn is_corrupt(&self) -> bool {
        self.kind == StoreErrorKind::Corrupt
    }
}

/// Prints the cause too (`idempotency store unavailable: connection refused`), so that a log
/// line of the error alone says what went wrong; [`source`](StdError::source) still returns
/// it, for code that inspects it.
impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.kind {
            StoreErrorKind::Unavailable => "idempotency store unavailable",
            StoreErrorKind::Timeout => "idempotency store timed out",
            StoreErrorKind::Full => "idempotency store is full",
            StoreErrorKind::Corrupt => "idempotency store returned a corrupt record",
        })?;
        match &self.source {
            Some(source) => write!(f, ": {source}"),
            None => Ok(()),
        }
    }
}

impl StdError for StoreError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn StdError + 'static))
    }
}
