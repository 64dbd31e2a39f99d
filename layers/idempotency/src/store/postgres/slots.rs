//! Where a transactional claim's open transaction waits for its handler, by claim token.

use super::claim_transaction::ClaimTransaction;
use crate::store::Settled;
use crate::store::{ClaimToken, StoreKey};
use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

/// What became of a claim's transaction.
pub(super) enum Slot {
    /// Opened by the claim, not taken by the handler (yet).
    Parked(ClaimTransaction),
    /// Out for a moment: its lease is being renewed on it (the layer's `extend`).
    Renewing,
    /// In the handler's hands.
    Taken,
    /// Committed by the handler through its claim.
    Committed,
    /// Taken and dropped without a commit: rolled back, or being rolled back until this
    /// says it is done.
    RolledBack(Option<tokio::sync::oneshot::Receiver<()>>),
}

struct Entry {
    key: StoreKey,
    slot: Slot,
    until: Instant,
}

/// What [`Slots::finish`] found.
pub(super) enum Finish {
    Done(Option<Slot>),
    Renewing,
}

/// What [`Slots::take`] found.
pub(super) enum Take {
    Took(ClaimTransaction),
    /// Being renewed: wait for [`Slots::changed`] and look again.
    Renewing,
    Gone,
}

/// The open claims of one store. Each entry lives until the layer completes or releases its
/// claim, or, if nothing ever does (a claim made outside the layers), until its lease passes
/// unrenewed: the next claim then drops it, and its transaction rolls back.
#[derive(Default)]
pub(crate) struct Slots {
    map: Mutex<HashMap<ClaimToken, Entry>>,
    /// Told each time a renewal gives its transaction back.
    renewed: Notify,
}

impl Slots {
    fn with<T>(&self, f: impl FnOnce(&mut HashMap<ClaimToken, Entry>) -> T) -> T {
        f(&mut self.map.lock().unwrap_or_else(PoisonError::into_inner))
    }

    pub(super) fn park(
        &self,
        key: StoreKey,
        token: ClaimToken,
        tx: ClaimTransaction,
        lease: Duration,
    ) {
        let now = Instant::now();
        let stale: Vec<Entry> = self.with(|map| {
            let expired: Vec<ClaimToken> = map
                .iter()
                .filter(|(_, entry)| entry.until <= now)
                .map(|(token, _)| *token)
                .collect();
            let stale = expired.iter().filter_map(|t| map.remove(t)).collect();
            let slot = Slot::Parked(tx);
            map.insert(
                token,
                Entry {
                    key,
                    slot,
                    until: now + lease,
                },
            );
            stale
        });
        // Dropped outside the lock: a transaction's drop reports back here.
        drop(stale);
    }

    pub(super) fn take(&self, token: ClaimToken) -> Take {
        self.with(|map| {
            let Some(entry) = map.get_mut(&token) else {
                return Take::Gone;
            };
            match std::mem::replace(&mut entry.slot, Slot::Taken) {
                Slot::Parked(tx) => Take::Took(tx),
                Slot::Renewing => {
                    entry.slot = Slot::Renewing;
                    Take::Renewing
                }
                other => {
                    entry.slot = other;
                    Take::Gone
                }
            }
        })
    }

    /// A future told when a renewal gives a transaction back; create it before [`take`].
    pub(super) fn changed(&self) -> tokio::sync::futures::Notified<'_> {
        self.renewed.notified()
    }

    pub(super) fn committed(&self, token: ClaimToken) {
        self.with(|map| {
            if let Some(entry) = map.get_mut(&token) {
                entry.slot = Slot::Committed;
            }
        });
    }

    /// Marks a taken transaction dropped; the sender says when it has ended.
    pub(super) fn rolled_back(
        &self,
        token: ClaimToken,
    ) -> Option<tokio::sync::oneshot::Sender<()>> {
        let sender = self.with(|map| {
            let entry = map.get_mut(&token)?;
            if !matches!(entry.slot, Slot::Taken | Slot::Renewing) {
                return None;
            }
            let (sender, receiver) = tokio::sync::oneshot::channel();
            entry.slot = Slot::RolledBack(Some(receiver));
            Some(sender)
        });
        self.renewed.notify_waiters();
        sender
    }

    /// Renews the entry's lease. A parked transaction is handed out to be kept alive on the
    /// database too (`Ok(Some)`), and must come back through [`renewed`](Self::renewed);
    /// `Ok(None)`: renewed here only (the handler holds the transaction); `Err`: gone.
    pub(super) fn renew(
        &self,
        key: StoreKey,
        token: ClaimToken,
        lease: Duration,
    ) -> Result<Option<ClaimTransaction>, ()> {
        self.with(|map| {
            let entry = map.get_mut(&token).filter(|e| e.key == key).ok_or(())?;
            match std::mem::replace(&mut entry.slot, Slot::Renewing) {
                Slot::Parked(tx) => {
                    entry.until = Instant::now() + lease;
                    Ok(Some(tx))
                }
                other @ (Slot::Taken | Slot::Renewing) => {
                    entry.slot = other;
                    entry.until = Instant::now() + lease;
                    Ok(None)
                }
                other => {
                    entry.slot = other;
                    Err(())
                }
            }
        })
    }

    /// Gives a renewed transaction back (or drops it, if its entry went meanwhile).
    pub(super) fn renewed(&self, token: ClaimToken, tx: ClaimTransaction) {
        let orphan = self.with(|map| match map.get_mut(&token) {
            Some(entry) if matches!(entry.slot, Slot::Renewing) => {
                entry.slot = Slot::Parked(tx);
                None
            }
            _ => Some(tx),
        });
        drop(orphan);
        self.renewed.notify_waiters();
    }

    /// Removes the entry of `token` if it is `key`'s, and returns it (dropping it is the
    /// caller's, outside the lock); [`Finish::Renewing`] while a renewal has its transaction
    /// out: wait for [`changed`](Self::changed) and ask again.
    pub(super) fn finish(&self, key: StoreKey, token: ClaimToken) -> Finish {
        self.with(|map| match map.get(&token) {
            Some(entry) if entry.key == key && matches!(entry.slot, Slot::Renewing) => {
                Finish::Renewing
            }
            Some(entry) if entry.key == key => {
                Finish::Done(map.remove(&token).map(|entry| entry.slot))
            }
            _ => Finish::Done(None),
        })
    }

    /// For a job's claim whose handler took the transaction and returned `Ok`: committed (the
    /// entry goes), or not (rolled back, or still held by a task the handler handed it to):
    /// left for the layer's release (which waits for a rollback under way), and the job runs
    /// again, since nothing says its effects committed.
    pub(super) fn settled(&self, token: ClaimToken) -> Settled {
        self.with(|map| match map.get(&token) {
            Some(Entry {
                slot: Slot::Committed,
                ..
            }) => {
                map.remove(&token);
                Settled::Done
            }
            Some(_) => Settled::Release,
            None => Settled::Done,
        })
    }
}
