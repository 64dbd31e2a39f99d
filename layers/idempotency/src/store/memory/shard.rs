//! One shard of the memory store: its records, their expiry indices, and what each scope
//! holds.

use crate::fingerprint::Fingerprint;
use crate::store::{ClaimToken, StoreKey, StoredResponse};
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use tokio::time::Instant;

#[derive(Default)]
pub(super) struct Shard {
    pub(super) map: HashMap<StoreKey, Entry>,
    // NOTE: every entry is in exactly one of these two expiry indices, under its current
    // `expires_at`; `insert`, `remove` and `do_extend` keep them in step with `map`.
    pub(super) leases: BTreeSet<(Instant, StoreKey)>,
    pub(super) completed: BTreeSet<(Instant, StoreKey)>,
    pub(super) bytes: usize,
    // What each scope holds in this shard, to decide who pays when room must be made.
    pub(super) scopes: HashMap<u64, ScopeUse>,
}

#[derive(Default)]
pub(super) struct ScopeUse {
    pub(super) entries: usize,
    pub(super) bytes: usize,
    pub(super) completed: BTreeSet<(Instant, StoreKey)>,
    // The completed records that hold a response (bytes): the only ones whose eviction frees
    // bytes. A not-replayable record holds none and is never evicted for bytes.
    pub(super) replayable: BTreeSet<(Instant, StoreKey)>,
}

pub(super) struct Entry {
    pub(super) fingerprint: Fingerprint,
    pub(super) scope: u64,
    pub(super) expires_at: Instant,
    pub(super) state: State,
}

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

impl Shard {
    pub(super) fn insert(&mut self, key: StoreKey, entry: Entry) {
        let size = entry.state.size();
        let usage = self.scopes.entry(entry.scope).or_default();
        usage.entries += 1;
        usage.bytes += size;
        match entry.state {
            State::InProgress { .. } => self.leases.insert((entry.expires_at, key)),
            _ => {
                usage.completed.insert((entry.expires_at, key));
                if size > 0 {
                    usage.replayable.insert((entry.expires_at, key));
                }
                self.completed.insert((entry.expires_at, key))
            }
        };
        self.bytes += size;
        self.map.insert(key, entry);
    }

    /// Turns the claim in progress under `key` into a completed record in place: one lookup
    /// instead of removing and inserting it. `false` if `key` holds no claim in progress.
    pub(super) fn complete(&mut self, key: &StoreKey, state: State, expires_at: Instant) -> bool {
        let Some(entry) = self.map.get_mut(key) else {
            return false;
        };
        if !matches!(entry.state, State::InProgress { .. }) {
            return false;
        }
        let size = state.size();
        let lease_end = std::mem::replace(&mut entry.expires_at, expires_at);
        entry.state = state;
        let scope = entry.scope;
        self.leases.remove(&(lease_end, *key));
        self.completed.insert((expires_at, *key));
        self.bytes += size;
        let usage = self.scopes.entry(scope).or_default();
        usage.bytes += size;
        usage.completed.insert((expires_at, *key));
        if size > 0 {
            usage.replayable.insert((expires_at, *key));
        }
        true
    }

    pub(super) fn remove(&mut self, key: &StoreKey) -> Option<Entry> {
        let entry = self.map.remove(key)?;
        let size = entry.state.size();
        let completed = !matches!(entry.state, State::InProgress { .. });
        match completed {
            false => self.leases.remove(&(entry.expires_at, *key)),
            true => self.completed.remove(&(entry.expires_at, *key)),
        };
        if let Some(usage) = self.scopes.get_mut(&entry.scope) {
            usage.entries -= 1;
            usage.bytes -= size;
            if completed {
                usage.completed.remove(&(entry.expires_at, *key));
                usage.replayable.remove(&(entry.expires_at, *key));
            }
            if usage.entries == 0 {
                self.scopes.remove(&entry.scope);
            }
        }
        self.bytes -= size;
        Some(entry)
    }

    /// The record to evict to make room for `claimer`: the oldest evictable record of the
    /// scope that holds the most (by `weight`), or else the claimer's own oldest. `None` if
    /// neither has one: the claimer is refused rather than a bystander paying for it.
    /// The claimer counts as the largest when it holds as much as any other scope, so a scope
    /// whose claims are all in progress never makes an equal pay for it.
    /// `pool` picks which of a scope's records are evictable (all completed ones for an
    /// entry, those holding bytes for bytes).
    pub(super) fn victim(
        &self,
        claimer: u64,
        weight: fn(&ScopeUse) -> usize,
        pool: fn(&ScopeUse) -> &BTreeSet<(Instant, StoreKey)>,
    ) -> Option<StoreKey> {
        let oldest = |scope: &u64| Some(pool(self.scopes.get(scope)?).first()?.1);
        let own = self.scopes.get(&claimer).map_or(0, weight);
        // The largest other scope; among equals, one with something to give.
        let largest = self
            .scopes
            .iter()
            .filter(|(scope, _)| **scope != claimer)
            .max_by_key(|(_, usage)| (weight(usage), !pool(usage).is_empty()))
            .filter(|(_, usage)| weight(usage) > own)
            .map(|(scope, _)| *scope);
        largest
            .and_then(|scope| oldest(&scope))
            .or_else(|| oldest(&claimer))
    }

    pub(super) fn owned_by(&mut self, key: &StoreKey, token: ClaimToken) -> Option<&mut Entry> {
        self.map
            .get_mut(key)
            .filter(|e| matches!(e.state, State::InProgress { token: t } if t == token))
    }

    pub(super) fn purge_expired(&mut self, now: Instant) {
        for index in [0, 1] {
            loop {
                let set = if index == 0 {
                    &self.leases
                } else {
                    &self.completed
                };
                match set.first() {
                    Some(&(at, key)) if at <= now => {
                        self.remove(&key);
                    }
                    _ => break,
                }
            }
        }
    }
}

#[cfg(test)]
impl Shard {
    /// Recomputes every index and count from `map` and panics, naming what disagrees, when the
    /// shard's bookkeeping does not match its records (test-only).
    pub(super) fn check_invariants(&self, max_entries: usize, max_bytes: usize, context: &str) {
        let mut leases = BTreeSet::new();
        let mut completed = BTreeSet::new();
        let mut bytes = 0;
        let mut scopes: HashMap<u64, (usize, usize, BTreeSet<_>, BTreeSet<_>)> = HashMap::new();
        for (key, entry) in &self.map {
            let size = entry.state.size();
            bytes += size;
            let usage = scopes.entry(entry.scope).or_default();
            usage.0 += 1;
            usage.1 += size;
            match entry.state {
                State::InProgress { .. } => {
                    leases.insert((entry.expires_at, *key));
                }
                _ => {
                    completed.insert((entry.expires_at, *key));
                    usage.2.insert((entry.expires_at, *key));
                    if size > 0 {
                        usage.3.insert((entry.expires_at, *key));
                    }
                }
            }
        }
        assert!(
            self.leases == leases,
            "{context}: `leases` disagrees with `map`"
        );
        assert!(
            self.completed == completed,
            "{context}: `completed` disagrees with `map`"
        );
        assert_eq!(self.bytes, bytes, "{context}: `bytes` disagrees with `map`");
        let mut tags: Vec<_> = self.scopes.keys().copied().collect();
        let mut expected: Vec<_> = scopes.keys().copied().collect();
        tags.sort_unstable();
        expected.sort_unstable();
        assert_eq!(
            tags, expected,
            "{context}: `scopes` holds other scopes than `map`"
        );
        for (tag, (entries, bytes, completed, replayable)) in scopes {
            let usage = &self.scopes[&tag];
            assert_eq!(usage.entries, entries, "{context}: scope {tag} `entries`");
            assert_eq!(usage.bytes, bytes, "{context}: scope {tag} `bytes`");
            assert!(
                usage.completed == completed,
                "{context}: scope {tag} `completed` disagrees with `map`"
            );
            assert!(
                usage.replayable == replayable,
                "{context}: scope {tag} `replayable` disagrees with `map`"
            );
        }
        assert!(
            self.map.len() <= max_entries,
            "{context}: {} entries over the bound {max_entries}",
            self.map.len()
        );
        assert!(
            self.bytes <= max_bytes,
            "{context}: {} bytes over the bound {max_bytes}",
            self.bytes
        );
    }
}
