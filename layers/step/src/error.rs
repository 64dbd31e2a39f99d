//! What a step that returned no result says about why.

use std::error::Error as StdError;
use std::fmt;
use std::time::SystemTime;
use tower_once_core::unsent::Unsent;
use tower_once_idempotency::store::StoreError;

type BoxError = Box<dyn StdError + Send + Sync>;

/// Why a step returned no result. Every kind says whether the call was sent.
pub struct StepError<E> {
    kind: Kind<E>,
}

enum Kind<E> {
    Inner(E),
    Unknown {
        key: String,
        sent_at: SystemTime,
        cause: Option<E>,
    },
    Mismatch,
    InProgress,
    Store(StoreError),
    Codec(BoxError),
    MissingScope,
    Invalid,
    Misused(&'static str),
}

/// A step error as the run-once layer reads it.
pub(crate) enum Cause<E> {
    Inner(E),
    Mismatch,
    InProgress,
    Store(StoreError),
    /// Anything else, said in words.
    Other(String),
}

impl<E> StepError<E> {
    pub(crate) fn into_cause(self) -> Cause<E> {
        match self.kind {
            Kind::Inner(e) => Cause::Inner(e),
            Kind::Mismatch => Cause::Mismatch,
            Kind::InProgress => Cause::InProgress,
            Kind::Store(e) => Cause::Store(e),
            Kind::Codec(e) => Cause::Other(format!("the record does not read: {e}")),
            Kind::Misused(why) => Cause::Other(why.to_owned()),
            Kind::Unknown { .. } => Cause::Other("recorded as an unknown outcome".to_owned()),
            Kind::MissingScope | Kind::Invalid => Cause::Other("an invalid id".to_owned()),
        }
    }

    pub(crate) fn inner(error: E) -> Self {
        Self {
            kind: Kind::Inner(error),
        }
    }

    pub(crate) fn unknown(key: String, sent_at: SystemTime, cause: Option<E>) -> Self {
        Self {
            kind: Kind::Unknown {
                key,
                sent_at,
                cause,
            },
        }
    }

    pub(crate) fn mismatch() -> Self {
        Self {
            kind: Kind::Mismatch,
        }
    }

    pub(crate) fn in_progress() -> Self {
        Self {
            kind: Kind::InProgress,
        }
    }

    pub(crate) fn store(error: StoreError) -> Self {
        Self {
            kind: Kind::Store(error),
        }
    }

    pub(crate) fn codec(error: BoxError) -> Self {
        Self {
            kind: Kind::Codec(error),
        }
    }

    pub(crate) fn missing_scope() -> Self {
        Self {
            kind: Kind::MissingScope,
        }
    }

    pub(crate) fn invalid() -> Self {
        Self {
            kind: Kind::Invalid,
        }
    }

    pub(crate) fn misused(why: &'static str) -> Self {
        Self {
            kind: Kind::Misused(why),
        }
    }

    /// The step cannot be run safely as configured (its message says why and what to do).
    /// Nothing was sent.
    pub fn is_misused(&self) -> bool {
        matches!(self.kind, Kind::Misused(_))
    }

    /// The inner service failed (its error is [`inner_error`](Self::inner_error)) before the
    /// call was sent, or the call may be sent again (keyed, idempotent, or its effect rolled
    /// back with the step's transaction): nothing was recorded, and a later attempt calls
    /// again. (A tool that committed its result in the step's transaction and then returned an
    /// error has done the step: a later attempt replays it.)
    pub fn is_inner(&self) -> bool {
        matches!(self.kind, Kind::Inner(_))
    }

    /// An attempt of this step may have been sent and its outcome was never recorded (a
    /// timeout, a gateway's `5xx`, a killed process: the sent mark is written just before the
    /// call), and the step's policy is [`OnUnknown::Refuse`](crate::OnUnknown::Refuse):
    /// the call is not sent again. The outcome is recorded as unknown, so every later attempt
    /// gets this error too. [`idempotency_key`](Self::idempotency_key) and
    /// [`sent_at`](Self::sent_at) say which call to look for downstream.
    pub fn is_unknown(&self) -> bool {
        matches!(self.kind, Kind::Unknown { .. })
    }

    /// The step is recorded with other arguments: the code that made the call changed.
    /// Nothing was sent.
    pub fn is_mismatch(&self) -> bool {
        matches!(self.kind, Kind::Mismatch)
    }

    /// The step is running elsewhere (another task, process or replica) and did not finish
    /// before the deadline. Nothing was sent by this attempt.
    pub fn is_in_progress(&self) -> bool {
        matches!(self.kind, Kind::InProgress)
    }

    /// The store failed or timed out before the call: nothing was sent.
    pub fn is_store(&self) -> bool {
        matches!(self.kind, Kind::Store(_))
    }

    /// The step's stored result could not be decoded (the result type changed, or the record
    /// is not this codec's). Nothing was sent.
    pub fn is_codec(&self) -> bool {
        matches!(self.kind, Kind::Codec(_))
    }

    /// The layer is [`scoped`](crate::StepLayer::scoped) and the step has no scope. Nothing
    /// was sent.
    pub fn is_missing_scope(&self) -> bool {
        matches!(self.kind, Kind::MissingScope)
    }

    /// The step id is invalid (a run id or tool name over
    /// [`MAX_ID_LEN`](crate::MAX_ID_LEN)). Nothing was sent.
    pub fn is_invalid(&self) -> bool {
        matches!(self.kind, Kind::Invalid)
    }

    /// The key the unknown call carried (or would have carried) downstream.
    pub fn idempotency_key(&self) -> Option<&str> {
        match &self.kind {
            Kind::Unknown { key, .. } => Some(key),
            _ => None,
        }
    }

    /// When the unknown call was sent (by the process that sent it, to the millisecond).
    pub fn sent_at(&self) -> Option<SystemTime> {
        match &self.kind {
            Kind::Unknown { sent_at, .. } => Some(*sent_at),
            _ => None,
        }
    }

    /// The inner service's error: the failure of an inner call, or what made an outcome unknown
    /// in this attempt (its timeout, say).
    pub fn inner_error(&self) -> Option<&E> {
        match &self.kind {
            Kind::Inner(e) => Some(e),
            Kind::Unknown { cause, .. } => cause.as_ref(),
            _ => None,
        }
    }

    /// The inner service's error, consuming this one.
    pub fn into_inner(self) -> Option<E> {
        match self.kind {
            Kind::Inner(e) => Some(e),
            Kind::Unknown { cause, .. } => cause,
            _ => None,
        }
    }
}

impl<E: Unsent> Unsent for StepError<E> {
    fn is_unsent(&self) -> bool {
        match &self.kind {
            Kind::Inner(e) => e.is_unsent(),
            Kind::Unknown { .. } => false,
            _ => true,
        }
    }
}

impl<E: fmt::Display> fmt::Display for StepError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Inner(e) => write!(f, "the step's call failed: {e}"),
            Kind::Unknown { key, .. } => write!(
                f,
                "the step's outcome is unknown: a call that may have been sent (carrying, or for a call without a key named, {key}) was never recorded, and the step may not be sent twice"
            ),
            Kind::Mismatch => f.write_str("the step is recorded with other arguments; nothing sent"),
            Kind::InProgress => f.write_str("the step is still running elsewhere at the deadline; nothing sent"),
            Kind::Store(e) => write!(f, "the step store failed: {e}"),
            Kind::Codec(e) => write!(f, "the step's stored result could not be read: {e}"),
            Kind::MissingScope => f.write_str("the step has no scope, and the layer requires one; nothing sent"),
            Kind::Invalid => f.write_str("the step id is too long; nothing sent"),
            Kind::Misused(why) => write!(f, "{why}; nothing sent"),
        }
    }
}

impl<E: fmt::Debug> fmt::Debug for StepError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Inner(e) => f.debug_tuple("StepError::Inner").field(e).finish(),
            Kind::Unknown {
                key,
                sent_at,
                cause,
            } => f
                .debug_struct("StepError::Unknown")
                .field("key", key)
                .field("sent_at", sent_at)
                .field("cause", cause)
                .finish(),
            Kind::Mismatch => f.write_str("StepError::Mismatch"),
            Kind::InProgress => f.write_str("StepError::InProgress"),
            Kind::Store(e) => f.debug_tuple("StepError::Store").field(e).finish(),
            Kind::Codec(e) => f.debug_tuple("StepError::Codec").field(e).finish(),
            Kind::MissingScope => f.write_str("StepError::MissingScope"),
            Kind::Invalid => f.write_str("StepError::Invalid"),
            Kind::Misused(why) => f.debug_tuple("StepError::Misused").field(why).finish(),
        }
    }
}

impl<E> StdError for StepError<E>
where
    E: StdError + 'static,
{
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        match &self.kind {
            Kind::Inner(e) => Some(e),
            Kind::Unknown { cause, .. } => cause.as_ref().map(|e| e as _),
            Kind::Store(e) => Some(e),
            Kind::Codec(e) => Some(&**e),
            _ => None,
        }
    }
}
