//! What a step returns: the result, and whether it was called, replayed or left unrecorded.

use crate::error::StepError;

/// What a step's future yields.
pub(crate) type Output<T, E> = Result<StepOutput<T>, StepError<E>>;

/// A step's result. See the [crate docs](crate).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepOutput<T> {
    value: T,
    how: How,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum How {
    Called {
        waited: bool,
    },
    Replayed {
        waited: bool,
    },
    Verified {
        waited: bool,
    },
    NotRecorded,
    /// The tool answered, but its transaction (and the record in it) rolled back.
    RolledBack,
    /// The tool answered, but whether its transaction committed the record is not known (it
    /// is still open, or the read failed): the record decides the next attempt.
    Unsettled,
}

impl<T> StepOutput<T> {
    pub(crate) fn called(value: T, waited: bool) -> Self {
        Self {
            value,
            how: How::Called { waited },
        }
    }

    pub(crate) fn replayed(value: T, waited: bool) -> Self {
        Self {
            value,
            how: How::Replayed { waited },
        }
    }

    pub(crate) fn verified(value: T, waited: bool) -> Self {
        Self {
            value,
            how: How::Verified { waited },
        }
    }

    pub(crate) fn not_recorded(value: T) -> Self {
        Self {
            value,
            how: How::NotRecorded,
        }
    }

    pub(crate) fn rolled_back(value: T) -> Self {
        Self {
            value,
            how: How::RolledBack,
        }
    }

    pub(crate) fn unsettled(value: T) -> Self {
        Self {
            value,
            how: How::Unsettled,
        }
    }

    /// Whether it is not known yet if the tool's transaction committed the record.
    pub(crate) fn is_unsettled(&self) -> bool {
        matches!(self.how, How::Unsettled)
    }

    /// Whether the tool's transaction rolled back the record it wrote (and its effects).
    pub(crate) fn is_rolled_back(&self) -> bool {
        matches!(self.how, How::RolledBack)
    }

    /// The stored result was returned; nothing was sent.
    pub fn is_replayed(&self) -> bool {
        matches!(self.how, How::Replayed { .. })
    }

    /// An earlier call's outcome was unknown, and the layer's
    /// [`verify`](crate::StepLayer::verify) hook found that it happened: its result is
    /// recorded, nothing sent.
    pub fn is_verified(&self) -> bool {
        matches!(self.how, How::Verified { .. })
    }

    /// The step waited for another task, process or replica running it.
    pub fn waited(&self) -> bool {
        matches!(
            self.how,
            How::Called { waited: true }
                | How::Replayed { waited: true }
                | How::Verified { waited: true }
        )
    }

    /// The result is the step's recorded result (called now and stored, replayed, or
    /// verified). `false` for an answer the classifier does not call a success (an upstream
    /// `409`, `429`, `4xx` or `5xx`), which is returned as it is and never stored, and for a
    /// success the store could not keep (a store failure, a result over the size limit, JSON
    /// that does not read back), logged. The step is not done: a later attempt of a keyed or
    /// idempotent step calls again; one of a step that may not be sent twice asks the verify
    /// hook or is settled unknown (its sent mark stays).
    pub fn is_recorded(&self) -> bool {
        !matches!(
            self.how,
            How::NotRecorded | How::RolledBack | How::Unsettled
        )
    }

    /// The result.
    pub fn value(&self) -> &T {
        &self.value
    }

    /// The result, consuming this.
    pub fn into_value(self) -> T {
        self.value
    }
}
