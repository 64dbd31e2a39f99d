//! The one rule of the crate: which failed requests may go to the secondary.

/// Why a failed request was sent to the secondary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Reason {
    /// The primary certainly never ran it: its circuit was open, the connection was refused,
    /// nothing was sent.
    Unsent,
    /// Running it twice is harmless by its nature: an idempotent method, or a request marked
    /// `SafeToRetry`.
    Idempotent,
    /// The layer was told its requests have no side effects
    /// ([`side_effect_free`](crate::FallbackLayer::side_effect_free)).
    SideEffectFree,
    /// The secondary shares the primary's idempotency records, and the request carries an
    /// idempotency key: the two run it once between them
    /// ([`shares_records`](crate::FallbackLayer::shares_records)).
    SharedRecords,
}

impl Reason {
    /// A stable lowercase name: `unsent`, `idempotent`, `side_effect_free`, `shared_records`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Unsent => "unsent",
            Self::Idempotent => "idempotent",
            Self::SideEffectFree => "side_effect_free",
            Self::SharedRecords => "shared_records",
        }
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the layer was told of its requests and its secondary.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Safety {
    pub(crate) side_effect_free: bool,
    pub(crate) shares_records: bool,
}

/// What a request says of itself.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Facts {
    /// An idempotent method, or marked `SafeToRetry`.
    pub(crate) idempotent: bool,
    /// Carries an idempotency key (or, for requests that cannot say, is assumed to).
    pub(crate) keyed: bool,
    /// A retried operation's later attempt (or a hedge): an earlier one may have run on the
    /// primary, so this one's being unsent says nothing of the operation.
    pub(crate) later_attempt: bool,
}

/// Whether a request whose primary failed may go to the secondary, and why.
///
/// NOTE: never a second effect: a request that may have run goes elsewhere only when running
/// it twice is harmless, or the secondary would recognise it.
pub(crate) fn decide(unsent: bool, facts: Facts, safety: Safety) -> Option<Reason> {
    if unsent && !facts.later_attempt {
        Some(Reason::Unsent)
    } else if facts.idempotent {
        Some(Reason::Idempotent)
    } else if safety.side_effect_free {
        Some(Reason::SideEffectFree)
    } else if safety.shares_records && facts.keyed {
        Some(Reason::SharedRecords)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The crate docs' table, row by row.
    #[test]
    fn the_table() {
        let plain = Facts::default();
        let idempotent = Facts {
            idempotent: true,
            ..Facts::default()
        };
        let keyed = Facts {
            keyed: true,
            ..Facts::default()
        };
        let retried = Facts {
            later_attempt: true,
            ..Facts::default()
        };
        let none = Safety::default();
        let free = Safety {
            side_effect_free: true,
            shares_records: false,
        };
        let shared = Safety {
            side_effect_free: false,
            shares_records: true,
        };
        assert_eq!(decide(true, plain, none), Some(Reason::Unsent));
        assert_eq!(decide(false, plain, none), None);
        assert_eq!(decide(false, idempotent, none), Some(Reason::Idempotent));
        assert_eq!(decide(false, plain, free), Some(Reason::SideEffectFree));
        assert_eq!(decide(false, keyed, shared), Some(Reason::SharedRecords));
        assert_eq!(
            decide(false, plain, shared),
            None,
            "no key: no shared record"
        );
        assert_eq!(
            decide(false, keyed, none),
            None,
            "a key the secondary does not know"
        );
        assert_eq!(
            decide(true, retried, none),
            None,
            "an earlier attempt may have run"
        );
    }
}
