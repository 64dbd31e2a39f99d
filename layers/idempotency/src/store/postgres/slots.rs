//! Where a transactional claim's open transaction waits for its handler, by claim token.

use super::transactional::ClaimTransaction;
use crate::claim::Settled;
use crate::store::ClaimToken;
use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;
use tokio::time::Instant;

/// What became of a claim's transaction.
pub(super) enum Slot {
    /// Opened by the claim, not taken by the handler (yet).
    Parked(ClaimTransaction),
    /// In the handler's hands.
    Taken,
    /// Committed by the handler through its claim.
    Committed,
    /// Taken and dropped without a commit: rolled back.
    RolledBack,
}

/// The open claims of one store. Each entry lives until the layer completes or releases its
/// claim, or, if nothing ever does (a claim made outside the layers), until its lease passes
/// unrenewed: the next claim then drops it, and its transaction rolls back.
#[derive(Default)]
pub(crate) struct Slots {
    map: Mutex<HashMap<ClaimToken, (Slot, Instant)>>,
}

impl Slots {
    fn with<T>(&self, f: impl FnOnce(&mut HashMap<ClaimToken, (Slot, Instant)>) -> T) -> T {
        f(&mut self.map.lock().unwrap_or_else(PoisonError::into_inner))
    }

    pub(super) fn park(&self, token: ClaimToken, tx: ClaimTransaction, lease: Duration) {
        let now = Instant::now();
        let stale: Vec<(Slot, Instant)> = self.with(|map| {
            let expired: Vec<ClaimToken> = map
                .iter()
                .filter(|(_, (_, until))| *until <= now)
                .map(|(token, _)| *token)
                .collect();
            let stale = expired.iter().filter_map(|t| map.remove(t)).collect();
            map.insert(token, (Slot::Parked(tx), now + lease));
            stale
        });
        // Dropped outside the lock: a transaction's drop reports back here.
        drop(stale);
    }

    pub(super) fn take(&self, token: ClaimToken) -> Option<ClaimTransaction> {
        self.with(|map| {
            let (slot, _) = map.get_mut(&token)?;
            match std::mem::replace(slot, Slot::Taken) {
                Slot::Parked(tx) => Some(tx),
                other => {
                    *slot = other;
                    None
                }
            }
        })
    }

    pub(super) fn committed(&self, token: ClaimToken) {
        self.set(token, Slot::Committed);
    }

    pub(super) fn rolled_back(&self, token: ClaimToken) {
        self.with(|map| {
            if let Some((slot @ Slot::Taken, _)) = map.get_mut(&token) {
                *slot = Slot::RolledBack;
            }
        });
    }

    fn set(&self, token: ClaimToken, to: Slot) {
        self.with(|map| {
            if let Some((slot, _)) = map.get_mut(&token) {
                *slot = to;
            }
        });
    }

    /// Renews the entry's lease; `false` if it is gone or finished.
    pub(super) fn extend(&self, token: ClaimToken, lease: Duration) -> bool {
        self.with(|map| match map.get_mut(&token) {
            Some((Slot::Parked(_) | Slot::Taken, until)) => {
                *until = Instant::now() + lease;
                true
            }
            _ => false,
        })
    }

    /// Removes the entry and returns it (dropping it is the caller's, outside the lock).
    pub(super) fn finish(&self, token: ClaimToken) -> Option<Slot> {
        self.with(|map| map.remove(&token)).map(|(slot, _)| slot)
    }

    /// For a job's claim whose handler took the transaction: committed (the entry goes), rolled
    /// back (it goes, and the layer releases), or still held or parked.
    pub(super) fn settled(&self, token: ClaimToken) -> Settled {
        let slot = self.with(|map| match map.get(&token) {
            Some((Slot::Committed | Slot::RolledBack, _)) => map.remove(&token),
            _ => None,
        });
        match slot {
            Some((Slot::RolledBack, _)) => Settled::Release,
            _ => Settled::Done,
        }
    }
}
