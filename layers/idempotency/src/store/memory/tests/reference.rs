//! A reference for the rankings: a shard as a plain map, scanned on every decision, by the
//! rules of the `MemoryStore` docs: expired records first, then who pays is the scope holding
//! the most (ties broken by the larger tag, as the heaps break them), the claimer's own when
//! no other holds strictly more; bytes demote instead of remove.

use super::super::entry::State;
use super::super::{lock, MemoryStore};
use crate::store::{ClaimOutcome, ClaimToken, RecordState, StoreError, StoreKey};
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;
use tokio::time::Instant;
use tower_once_core::time::saturating_add;

#[derive(Clone, Copy, PartialEq, Debug)]
pub(super) enum RefState {
    Held(ClaimToken),
    Done(usize),
    NotReplayable,
}

#[derive(Clone, Copy, PartialEq, Debug)]
pub(super) struct RefRecord {
    pub(super) scope: u64,
    pub(super) expires: Instant,
    pub(super) state: RefState,
}

#[derive(PartialEq, Debug)]
pub(super) enum Answer {
    Claimed,
    Held,
    Completed,
    NotReplayable,
    Full,
}

/// The rules, by scanning: expired records first, then who pays is the scope holding the most
/// (ties broken by the larger tag, as the heaps break them), the claimer's own when no other
/// holds strictly more; bytes demote instead of remove.
pub(super) struct RefShard {
    pub(super) map: BTreeMap<StoreKey, RefRecord>,
    pub(super) max_entries: usize,
    pub(super) max_bytes: usize,
}

impl RefShard {
    fn bytes(&self) -> usize {
        self.map
            .values()
            .map(|r| match r.state {
                RefState::Done(size) => size,
                _ => 0,
            })
            .sum()
    }

    /// entries, bytes, oldest completed, oldest replayable.
    #[allow(clippy::type_complexity)]
    fn scopes(
        &self,
    ) -> HashMap<
        u64,
        (
            usize,
            usize,
            Option<(Instant, StoreKey)>,
            Option<(Instant, StoreKey)>,
        ),
    > {
        let mut scopes: HashMap<u64, (usize, usize, Option<_>, Option<_>)> = HashMap::new();
        for (key, r) in &self.map {
            let u = scopes.entry(r.scope).or_default();
            u.0 += 1;
            let at = (r.expires, *key);
            let first = |cur: Option<(Instant, StoreKey)>| Some(cur.map_or(at, |c| c.min(at)));
            match r.state {
                RefState::Held(_) => {}
                RefState::Done(size) => {
                    u.1 += size;
                    u.2 = first(u.2);
                    u.3 = first(u.3);
                }
                RefState::NotReplayable => u.2 = first(u.2),
            }
        }
        scopes
    }

    fn purge_expired(&mut self, now: Instant, scope: u64) {
        self.map.retain(|_, r| match r.state {
            RefState::Held(_) => r.expires > now,
            _ => r.scope != scope || r.expires > now,
        });
    }

    fn purge_all_expired(&mut self, now: Instant) {
        self.map
            .retain(|_, r| matches!(r.state, RefState::Held(_)) || r.expires > now);
    }

    fn victim(&self, claimer: u64) -> Option<StoreKey> {
        let scopes = self.scopes();
        let own = scopes.get(&claimer).map_or(0, |u| u.0);
        let largest = scopes
            .iter()
            .filter(|(tag, _)| **tag != claimer)
            .max_by_key(|(tag, u)| (u.0, u.2.is_some(), **tag))
            .filter(|(_, u)| u.0 > own)
            .map(|(tag, _)| *tag);
        let oldest_of = |tag: u64| Some(scopes.get(&tag)?.2?.1);
        largest.and_then(oldest_of).or_else(|| oldest_of(claimer))
    }

    pub(super) fn claim(&mut self, key: StoreKey, token: ClaimToken, lease: Duration) -> Answer {
        let now = Instant::now();
        let scope = key.scope_tag();
        self.purge_expired(now, scope);
        if let Some(r) = self.map.get(&key).copied() {
            if r.expires <= now {
                self.map.remove(&key);
            } else {
                return match r.state {
                    RefState::Held(_) => Answer::Held,
                    RefState::Done(_) => Answer::Completed,
                    RefState::NotReplayable => Answer::NotReplayable,
                };
            }
        }
        if self.map.len() >= self.max_entries {
            self.purge_all_expired(now);
        }
        if self.map.len() >= self.max_entries {
            match self.victim(scope) {
                Some(victim) => {
                    self.map.remove(&victim);
                }
                None => return Answer::Full,
            }
        }
        self.map.insert(
            key,
            RefRecord {
                scope,
                expires: saturating_add(now, lease),
                state: RefState::Held(token),
            },
        );
        Answer::Claimed
    }

    fn owned(&self, key: &StoreKey, token: ClaimToken) -> Option<RefRecord> {
        self.map
            .get(key)
            .copied()
            .filter(|r| r.state == RefState::Held(token))
    }

    pub(super) fn complete(
        &mut self,
        key: StoreKey,
        token: ClaimToken,
        size: Option<usize>,
        retention: Duration,
    ) -> bool {
        let now = Instant::now();
        self.purge_expired(now, key.scope_tag());
        let Some(record) = self.owned(&key, token) else {
            return false;
        };
        let claimer = record.scope;
        // A record born at its end is never answered: its response takes no room.
        let mut size = size.filter(|size| *size <= self.max_bytes && !retention.is_zero());
        let needed = size.unwrap_or(0);
        if self.bytes() + needed > self.max_bytes {
            self.purge_all_expired(now);
            while self.bytes() + needed > self.max_bytes {
                let scopes = self.scopes();
                let own = scopes.get(&claimer).map_or(0, |u| u.1);
                let payer = scopes
                    .iter()
                    .filter(|(tag, u)| **tag != claimer && u.1 > 0)
                    .max_by_key(|(tag, u)| (u.1, **tag))
                    .filter(|(_, u)| u.1 > own)
                    .map_or(claimer, |(tag, _)| *tag);
                let Some((_, victim)) = scopes.get(&payer).and_then(|u| u.3) else {
                    size = None;
                    break;
                };
                self.map.get_mut(&victim).unwrap().state = RefState::NotReplayable;
            }
        }
        self.map.insert(
            key,
            RefRecord {
                scope: claimer,
                expires: saturating_add(now, retention),
                state: size.map_or(RefState::NotReplayable, RefState::Done),
            },
        );
        true
    }

    pub(super) fn release(&mut self, key: StoreKey, token: ClaimToken) -> bool {
        self.purge_expired(Instant::now(), key.scope_tag());
        if self.owned(&key, token).is_none() {
            return false;
        }
        self.map.remove(&key);
        true
    }

    pub(super) fn extend(&mut self, key: StoreKey, token: ClaimToken, lease: Duration) -> bool {
        let now = Instant::now();
        self.purge_expired(now, key.scope_tag());
        if self.owned(&key, token).is_none() {
            return false;
        }
        self.map.get_mut(&key).unwrap().expires = saturating_add(now, lease);
        true
    }
}

pub(super) fn answer(outcome: Result<ClaimOutcome, StoreError>) -> Answer {
    match outcome {
        Ok(ClaimOutcome::Claimed) => Answer::Claimed,
        Ok(ClaimOutcome::Existing(r)) => match r.state {
            RecordState::InProgress { .. } => Answer::Held,
            RecordState::Completed(_) => Answer::Completed,
            RecordState::NotReplayable => Answer::NotReplayable,
        },
        Err(e) if e.is_full() => Answer::Full,
        Err(e) => panic!("unexpected store error {e:?}"),
    }
}

pub(super) fn snapshot(store: &MemoryStore) -> BTreeMap<StoreKey, RefRecord> {
    let shard = lock(&store.inner.shards[0]);
    shard
        .records()
        .map(|(key, e)| {
            let state = match &e.state {
                State::InProgress { token } => RefState::Held(*token),
                State::Completed { size, .. } => RefState::Done(*size),
                State::NotReplayable => RefState::NotReplayable,
            };
            let record = RefRecord {
                scope: e.scope,
                expires: e.expires_at,
                state,
            };
            (*key, record)
        })
        .collect()
}
