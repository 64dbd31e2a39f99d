//! One record of the memory store: what a key's claim or answer holds.

use crate::fingerprint::Fingerprint;
use crate::store::{ClaimToken, StoredResponse};
use std::sync::Arc;
use tokio::time::Instant;

/// A key's record: whose request it fingerprints, its scope's tag, when it ends (the lease of
/// a claim, or the retention of an answer), and what it holds.
pub(super) struct Entry {
    pub(super) fingerprint: Fingerprint,
    pub(super) scope: u64,
    pub(super) expires_at: Instant,
    pub(super) state: State,
}

/// A claim in progress, a stored answer, or an answer whose handler ran but that is kept
/// without its response.
pub(super) enum State {
    InProgress {
        token: ClaimToken,
    },
    // `size` is the response's approximate size, counted once: every index update needs it.
    Completed {
        response: Arc<StoredResponse>,
        size: usize,
    },
    NotReplayable,
}

impl State {
    pub(super) fn completed(response: StoredResponse) -> Self {
        State::Completed {
            size: response.approximate_size(),
            response: Arc::new(response),
        }
    }

    pub(super) fn size(&self) -> usize {
        match self {
            State::Completed { size, .. } => *size,
            State::InProgress { .. } | State::NotReplayable => 0,
        }
    }
}
