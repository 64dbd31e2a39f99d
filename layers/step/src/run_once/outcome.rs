//! What [`RunOnce`](super::RunOnce) answers when its handler ran, or did not need to.

/// How a message went through [`RunOnce`](super::RunOnce).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunOnceOutcome<R> {
    /// The handler ran (this delivery) and returned this.
    Done(R),
    /// The id's effect was already done, or another entry with the same id is running it (it
    /// stays pending until it is done, or is delivered again if it fails); the handler did not
    /// run.
    Duplicate,
}

impl<R> RunOnceOutcome<R> {
    /// Whether the handler was skipped as a duplicate.
    pub fn is_duplicate(&self) -> bool {
        matches!(self, Self::Duplicate)
    }

    /// The handler's response, if it ran.
    pub fn into_response(self) -> Option<R> {
        match self {
            Self::Done(r) => Some(r),
            Self::Duplicate => None,
        }
    }

    /// A stable name for logs: `done` or `duplicate`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Done(_) => "done",
            Self::Duplicate => "duplicate",
        }
    }
}
