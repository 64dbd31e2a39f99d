//! One shard of the memory store: its records, their expiry indices, and what each scope
//! holds.

use crate::fingerprint::Fingerprint;
use crate::store::{ClaimToken, StoreKey, StoredResponse};
use std::collections::{BTreeSet, BinaryHeap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;
use tokio::time::Instant;

#[derive(Default)]
pub(super) struct Shard {
    pub(super) map: HashMap<StoreKey, Entry>,
    // NOTE: every claim in progress is here under its current `expires_at`, and every
    // completed record in its scope's `replayable` or `not_replayable`; `insert`, `complete`,
    // `remove` and `do_extend` keep them in step with `map`. One index entry per record:
    // expired completed records are dropped per scope (the scope of each operation, and every
    // scope when room must be made), so no shard-wide index of them is needed.
    pub(super) leases: BTreeSet<(Instant, StoreKey)>,
    pub(super) bytes: usize,
    // What each scope holds in this shard, to decide who pays when room must be made.
    pub(super) scopes: HashMap<u64, ScopeUse, BuildHasherDefault<TagHasher>>,
}

/// Hashes a scope tag as itself. Tags are already keyed hashes (SipHash under a random
/// per-process key, see `StoreKey::scope_tag`), so a client cannot aim tags at one bucket, and
/// hashing them again would only repeat work every operation pays.
#[derive(Default)]
pub(super) struct TagHasher(u64);

impl Hasher for TagHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Not reached for `u64` keys (`write_u64`); correct for any other input anyway.
        for byte in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*byte);
        }
    }

    fn write_u64(&mut self, tag: u64) {
        self.0 = tag;
    }
}

#[cfg(test)]
thread_local! {
    /// Counts the scans of a shard's scopes this thread made (test-only): what an operation
    /// costs beyond its own key's records.
    pub(super) static SCOPE_SCANS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

#[inline(always)]
fn scanned() {
    #[cfg(test)]
    SCOPE_SCANS.with(|scans| scans.set(scans.get() + 1));
}

#[derive(Default)]
pub(super) struct ScopeUse {
    pub(super) entries: usize,
    pub(super) bytes: usize,
    // The completed records that hold a response (bytes): the only ones whose eviction frees
    // bytes. A not-replayable record holds none and is never evicted for bytes.
    pub(super) replayable: BTreeSet<(Instant, StoreKey)>,
    pub(super) not_replayable: BTreeSet<(Instant, StoreKey)>,
}

impl ScopeUse {
    /// The completed record that expires first.
    pub(super) fn oldest_completed(&self) -> Option<(Instant, StoreKey)> {
        match (self.replayable.first(), self.not_replayable.first()) {
            (Some(a), Some(b)) => Some(*a.min(b)),
            (a, b) => a.or(b).copied(),
        }
    }

    /// The completed record that holds bytes and expires first.
    pub(super) fn oldest_replayable(&self) -> Option<(Instant, StoreKey)> {
        self.replayable.first().copied()
    }

    fn index(&mut self, state: &State) -> &mut BTreeSet<(Instant, StoreKey)> {
        match state {
            State::NotReplayable => &mut self.not_replayable,
            State::Completed { .. } | State::InProgress { .. } => &mut self.replayable,
        }
    }
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
            _ => usage.index(&entry.state).insert((entry.expires_at, key)),
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
        let scope = entry.scope;
        self.leases.remove(&(lease_end, *key));
        self.bytes += size;
        let usage = self.scopes.entry(scope).or_default();
        usage.bytes += size;
        usage.index(&state).insert((expires_at, *key));
        entry.state = state;
        true
    }

    pub(super) fn remove(&mut self, key: &StoreKey) -> Option<Entry> {
        let entry = self.map.remove(key)?;
        let size = entry.state.size();
        let at = (entry.expires_at, *key);
        if let State::InProgress { .. } = entry.state {
            self.leases.remove(&at);
        }
        if let Some(usage) = self.scopes.get_mut(&entry.scope) {
            usage.entries -= 1;
            usage.bytes -= size;
            if !matches!(entry.state, State::InProgress { .. }) {
                usage.index(&entry.state).remove(&at);
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
    /// `oldest` picks a scope's first evictable record (of all completed ones for an entry,
    /// of those holding bytes for bytes). Expired records are dropped first
    /// ([`purge_all_expired`](Self::purge_all_expired)), so only live ones are weighed.
    pub(super) fn victim(
        &self,
        claimer: u64,
        weight: fn(&ScopeUse) -> usize,
        oldest: fn(&ScopeUse) -> Option<(Instant, StoreKey)>,
    ) -> Option<StoreKey> {
        scanned();
        let oldest_of = |scope: &u64| Some(oldest(self.scopes.get(scope)?)?.1);
        let own = self.scopes.get(&claimer).map_or(0, weight);
        // The largest other scope; among equals, one with something to give.
        let largest = self
            .scopes
            .iter()
            .filter(|(scope, _)| **scope != claimer)
            .max_by_key(|(_, usage)| (weight(usage), oldest(usage).is_some()))
            .filter(|(_, usage)| weight(usage) > own)
            .map(|(scope, _)| *scope);
        largest
            .and_then(|scope| oldest_of(&scope))
            .or_else(|| oldest_of(&claimer))
    }

    /// Evicts records holding bytes until `size` more bytes fit in `max`, each chosen as
    /// [`victim`](Self::victim) would by bytes (the oldest of the scope holding the most, if it
    /// holds strictly more than `claimer`, else the claimer's own oldest); `false` if they do
    /// not fit even then. One scan of the scopes builds a heap of what the others hold; each
    /// eviction then changes one scope, updated in the heap: not a scan per record evicted.
    pub(super) fn make_room_for_bytes(&mut self, claimer: u64, size: usize, max: usize) -> bool {
        scanned();
        let mut others: BinaryHeap<(usize, u64)> = self
            .scopes
            .iter()
            .filter(|(scope, usage)| **scope != claimer && usage.bytes > 0)
            .map(|(scope, usage)| (usage.bytes, *scope))
            .collect();
        while self.bytes + size > max {
            let own = self.scopes.get(&claimer).map_or(0, |usage| usage.bytes);
            let payer = match others.peek() {
                Some(&(bytes, scope)) if bytes > own => {
                    others.pop();
                    scope
                }
                _ => claimer,
            };
            let Some((_, key)) = self
                .scopes
                .get(&payer)
                .and_then(ScopeUse::oldest_replayable)
            else {
                return false;
            };
            self.remove(&key);
            if payer != claimer {
                if let Some(usage) = self.scopes.get(&payer).filter(|usage| usage.bytes > 0) {
                    others.push((usage.bytes, payer));
                }
            }
        }
        true
    }

    pub(super) fn owned_by(&mut self, key: &StoreKey, token: ClaimToken) -> Option<&mut Entry> {
        self.map
            .get_mut(key)
            .filter(|e| matches!(e.state, State::InProgress { token: t } if t == token))
    }

    /// Drops the claims whose lease ended, and `scope`'s completed records past their
    /// retention (what an operation on a key of `scope` may meet).
    pub(super) fn purge_expired(&mut self, now: Instant, scope: u64) {
        while let Some(&(at, key)) = self.leases.first() {
            if at > now {
                break;
            }
            self.remove(&key);
        }
        self.purge_scope(now, scope);
    }

    /// Drops every scope's completed records past their retention: before room is made, so
    /// that a live record never pays while an expired one stays. A scan of the shard's scopes,
    /// as choosing who pays already is.
    pub(super) fn purge_all_expired(&mut self, now: Instant) {
        scanned();
        let expired: Vec<u64> = self
            .scopes
            .iter()
            .filter(|(_, usage)| usage.oldest_completed().is_some_and(|(at, _)| at <= now))
            .map(|(scope, _)| *scope)
            .collect();
        for scope in expired {
            self.purge_scope(now, scope);
        }
    }

    fn purge_scope(&mut self, now: Instant, scope: u64) {
        while let Some((at, key)) = self.scopes.get(&scope).and_then(ScopeUse::oldest_completed) {
            if at > now {
                break;
            }
            self.remove(&key);
        }
    }
}

#[cfg(test)]
impl Shard {
    /// Recomputes every index and count from `map` and panics, naming what disagrees, when the
    /// shard's bookkeeping does not match its records (test-only).
    pub(super) fn check_invariants(&self, max_entries: usize, max_bytes: usize, context: &str) {
        let mut leases = BTreeSet::new();
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
                State::Completed { .. } => {
                    assert!(size > 0, "{context}: a stored response of no bytes");
                    usage.2.insert((entry.expires_at, *key));
                }
                State::NotReplayable => {
                    usage.3.insert((entry.expires_at, *key));
                }
            }
        }
        assert!(
            self.leases == leases,
            "{context}: `leases` disagrees with `map`"
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
        for (tag, (entries, bytes, replayable, not_replayable)) in scopes {
            let usage = &self.scopes[&tag];
            assert_eq!(usage.entries, entries, "{context}: scope {tag} `entries`");
            assert_eq!(usage.bytes, bytes, "{context}: scope {tag} `bytes`");
            assert!(
                usage.replayable == replayable,
                "{context}: scope {tag} `replayable` disagrees with `map`"
            );
            assert!(
                usage.not_replayable == not_replayable,
                "{context}: scope {tag} `not_replayable` disagrees with `map`"
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
