use std::error::Error as StdError;
use std::fmt;
use tower_once_core::unsent::Unsent;

/// The error of a [`Fallback`](crate::Fallback): the primary's, when the request did not go to
/// the secondary; the secondary's when it did; or the deadline, when it passed while the
/// secondary was running.
///
/// ```
/// use tower_once_fallback::FallbackError;
///
/// let e: FallbackError<std::io::Error, std::io::Error> =
///     FallbackError::primary(std::io::Error::other("reset"));
/// assert!(e.is_primary() && e.get_secondary().is_none());
/// assert_eq!(e.to_string(), "reset");
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct FallbackError<PE, SE = PE> {
    kind: Kind<PE, SE>,
}

#[derive(Clone, PartialEq, Eq)]
enum Kind<PE, SE> {
    Primary(PE),
    Secondary(SE),
    Deadline,
}

impl<PE, SE> FallbackError<PE, SE> {
    /// The primary failed, and the request did not go to the secondary (it may have run, or
    /// the failure was final, or no time was left).
    pub const fn primary(error: PE) -> Self {
        Self {
            kind: Kind::Primary(error),
        }
    }

    /// The request went to the secondary, which failed too.
    pub const fn secondary(error: SE) -> Self {
        Self {
            kind: Kind::Secondary(error),
        }
    }

    /// The operation's deadline passed while the secondary was running it (it may still
    /// complete there), or while the request body was being read.
    pub const fn deadline() -> Self {
        Self {
            kind: Kind::Deadline,
        }
    }

    /// Whether this is the primary's error.
    pub const fn is_primary(&self) -> bool {
        matches!(self.kind, Kind::Primary(_))
    }

    /// Whether this is the secondary's error.
    pub const fn is_secondary(&self) -> bool {
        matches!(self.kind, Kind::Secondary(_))
    }

    /// Whether the deadline passed while the secondary was running.
    pub const fn is_deadline(&self) -> bool {
        matches!(self.kind, Kind::Deadline)
    }

    /// The primary's error, if the request stayed there.
    pub const fn get_primary(&self) -> Option<&PE> {
        match &self.kind {
            Kind::Primary(e) => Some(e),
            _ => None,
        }
    }

    /// The secondary's error, if the request went there.
    pub const fn get_secondary(&self) -> Option<&SE> {
        match &self.kind {
            Kind::Secondary(e) => Some(e),
            _ => None,
        }
    }
}

impl<PE: fmt::Debug, SE: fmt::Debug> fmt::Debug for FallbackError<PE, SE> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Primary(e) => f.debug_tuple("FallbackError::Primary").field(e).finish(),
            Kind::Secondary(e) => f.debug_tuple("FallbackError::Secondary").field(e).finish(),
            Kind::Deadline => f.write_str("FallbackError::Deadline"),
        }
    }
}

impl<PE: fmt::Display, SE: fmt::Display> fmt::Display for FallbackError<PE, SE> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Primary(e) => e.fmt(f),
            Kind::Secondary(e) => write!(f, "the fallback failed too: {e}"),
            Kind::Deadline => f.write_str(
                "the deadline passed before an answer; the operation may still complete",
            ),
        }
    }
}

impl<PE, SE> StdError for FallbackError<PE, SE>
where
    PE: StdError + 'static,
    SE: StdError + 'static,
{
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        match &self.kind {
            Kind::Primary(e) => Some(e),
            Kind::Secondary(e) => Some(e),
            Kind::Deadline => None,
        }
    }
}

/// Unsent when the error's side never ran it; the deadline cut a call under way.
impl<PE: Unsent, SE: Unsent> Unsent for FallbackError<PE, SE> {
    fn is_unsent(&self) -> bool {
        match &self.kind {
            Kind::Primary(e) => e.is_unsent(),
            // The secondary was only tried after the primary's failure; it ran nothing only
            // if the primary did not either, which the secondary's error cannot say.
            Kind::Secondary(_) | Kind::Deadline => false,
        }
    }
}
