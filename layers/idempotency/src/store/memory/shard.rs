//! One shard of the memory store: its records, their expiry indices, and what each scope
//! holds.

use super::entry::{Entry, State};
use super::rank::Ranking;
use crate::store::{ClaimToken, StoreKey, StoredResponse};
use std::cmp::Reverse;
use std::collections::{BTreeSet, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;
use tokio::time::Instant;

#[cfg(test)]
mod inspect;

#[derive(Default)]
pub(super) struct Shard {
    map: HashMap<StoreKey, Entry>,
    // NOTE: every claim in progress is here under its current `expires_at`, and every
    // completed record in its scope's `replayable` or `not_replayable`; `insert`, `complete`,
    // `remove` and `extend` keep them in step with `map`. One index entry per record:
    // expired completed records are dropped per scope (the scope of each operation, and every
    // scope when room must be made), so no shard-wide index of them is needed.
    leases: BTreeSet<(Instant, StoreKey)>,
    bytes: usize,
    // What each scope holds in this shard, to decide who pays when room must be made.
    scopes: Scopes,
    // The scopes ranked by entries (and whether they hold a completed record), by bytes, and
    // by their first completed record to expire: a full shard finds who pays, and what
    // expired, without visiting every scope. Each is pushed to as its rank changes.
    by_entries: Ranking<(usize, bool)>,
    by_bytes: Ranking<usize>,
    by_expiry: Ranking<Reverse<Instant>>,
}

/// Hashes a scope tag as itself. Tags are already keyed hashes (SipHash under a random
/// per-process key, see `StoreKey::scope_tag`), so a client cannot aim tags at one bucket, and
/// hashing them again would only repeat work every operation pays.
#[derive(Default)]
struct TagHasher(u64);

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

#[derive(Default)]
struct ScopeUse {
    entries: usize,
    bytes: usize,
    // The completed records that hold a response (bytes): the only ones whose eviction frees
    // bytes. A not-replayable record holds none and is never evicted for bytes.
    replayable: BTreeSet<(Instant, StoreKey)>,
    not_replayable: BTreeSet<(Instant, StoreKey)>,
}

impl ScopeUse {
    /// The completed record that expires first.
    fn oldest_completed(&self) -> Option<(Instant, StoreKey)> {
        match (self.replayable.first(), self.not_replayable.first()) {
            (Some(a), Some(b)) => Some(*a.min(b)),
            (a, b) => a.or(b).copied(),
        }
    }

    /// The completed record that holds bytes and expires first.
    fn oldest_replayable(&self) -> Option<(Instant, StoreKey)> {
        self.replayable.first().copied()
    }

    /// Its rank for room by entries: what it holds, then whether it has a completed record to
    /// give (among equals, one that can pay is chosen).
    fn entries_rank(&self) -> (usize, bool) {
        let gives = !(self.replayable.is_empty() && self.not_replayable.is_empty());
        (self.entries, gives)
    }

    /// Its rank for room by bytes: `None` when it holds none.
    fn bytes_rank(&self) -> Option<usize> {
        (self.bytes > 0).then_some(self.bytes)
    }

    /// Its rank for expiry: the end of its first completed record to expire, soonest first.
    fn expiry_rank(&self) -> Option<Reverse<Instant>> {
        self.oldest_completed().map(|(at, _)| Reverse(at))
    }

    fn index(&mut self, state: &State) -> &mut BTreeSet<(Instant, StoreKey)> {
        match state {
            State::NotReplayable => &mut self.not_replayable,
            State::Completed { .. } | State::InProgress { .. } => &mut self.replayable,
        }
    }
}

impl Shard {
    /// The records held, expired ones that were not dropped yet included.
    pub(super) fn len(&self) -> usize {
        self.map.len()
    }

    /// The bytes of the responses held.
    pub(super) fn bytes(&self) -> usize {
        self.bytes
    }

    /// The record under `key`, expired or not.
    pub(super) fn get(&self, key: &StoreKey) -> Option<&Entry> {
        self.map.get(key)
    }

    pub(super) fn insert(&mut self, key: StoreKey, entry: Entry) {
        let size = entry.state.size();
        let scope = entry.scope;
        let usage = self.scopes.entry(scope).or_default();
        usage.entries += 1;
        usage.bytes += size;
        let completed = !matches!(entry.state, State::InProgress { .. });
        match entry.state {
            State::InProgress { .. } => self.leases.insert((entry.expires_at, key)),
            _ => usage.index(&entry.state).insert((entry.expires_at, key)),
        };
        self.bytes += size;
        self.map.insert(key, entry);
        self.rank_entries(scope);
        if completed {
            self.rank_bytes(scope);
            self.rank_expiry(scope);
        }
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
        let gave = usage.entries_rank().1;
        usage.bytes += size;
        usage.index(&state).insert((expires_at, *key));
        let first_to_expire = usage.oldest_completed() == Some((expires_at, *key));
        entry.state = state;
        if !gave {
            self.rank_entries(scope);
        }
        if size > 0 {
            self.rank_bytes(scope);
        }
        if first_to_expire {
            self.rank_expiry(scope);
        }
        true
    }

    pub(super) fn remove(&mut self, key: &StoreKey) -> Option<Entry> {
        let entry = self.map.remove(key)?;
        let size = entry.state.size();
        let at = (entry.expires_at, *key);
        let completed = !matches!(entry.state, State::InProgress { .. });
        if !completed {
            self.leases.remove(&at);
        }
        if let Some(usage) = self.scopes.get_mut(&entry.scope) {
            usage.entries -= 1;
            usage.bytes -= size;
            if completed {
                usage.index(&entry.state).remove(&at);
            }
            if usage.entries == 0 {
                // Its ranks go stale, and are dropped as they are met.
                self.scopes.remove(&entry.scope);
            } else {
                self.rank_entries(entry.scope);
                if completed {
                    self.rank_bytes(entry.scope);
                    self.rank_expiry(entry.scope);
                }
            }
        }
        self.bytes -= size;
        Some(entry)
    }

    /// Drops the response of the completed record under `key` and keeps the record as not
    /// replayable: its handler ran, so its key must stay taken. Returns the response, to be
    /// dropped once the lock is released.
    fn demote(&mut self, key: &StoreKey) -> Option<Arc<StoredResponse>> {
        let entry = self.map.get_mut(key)?;
        let state = std::mem::replace(&mut entry.state, State::NotReplayable);
        let State::Completed { response, size } = state else {
            entry.state = state;
            return None;
        };
        let at = (entry.expires_at, *key);
        let scope = entry.scope;
        if let Some(usage) = self.scopes.get_mut(&scope) {
            usage.bytes -= size;
            usage.replayable.remove(&at);
            usage.not_replayable.insert(at);
        }
        self.bytes -= size;
        self.rank_bytes(scope);
        Some(response)
    }

    fn rank_entries(&mut self, scope: u64) {
        rank(&mut self.by_entries, &self.scopes, scope, |u| {
            Some(u.entries_rank())
        });
    }

    fn rank_bytes(&mut self, scope: u64) {
        rank(
            &mut self.by_bytes,
            &self.scopes,
            scope,
            ScopeUse::bytes_rank,
        );
    }

    fn rank_expiry(&mut self, scope: u64) {
        rank(
            &mut self.by_expiry,
            &self.scopes,
            scope,
            ScopeUse::expiry_rank,
        );
    }

    /// The record to evict to make room for a new entry of `claimer`: the oldest completed
    /// record of the scope that holds the most entries, or else the claimer's own oldest.
    /// `None` if neither has one: the claimer is refused rather than a bystander paying for it.
    /// The claimer counts as the largest when it holds as much as any other scope, so a scope
    /// whose claims are all in progress never makes an equal pay for it. Expired records are
    /// dropped first ([`purge_all_expired`](Self::purge_all_expired)), so only live ones are
    /// weighed.
    pub(super) fn victim(&mut self, claimer: u64) -> Option<StoreKey> {
        let own = self.scopes.get(&claimer).map_or(0, |usage| usage.entries);
        let scopes = &self.scopes;
        // The largest scope; among equals, one with something to give. When it is not the
        // claimer but holds no more than it, the claimer counts as the largest.
        let largest = top(&mut self.by_entries, scopes, |u| Some(u.entries_rank()))
            .filter(|&((entries, _), tag)| tag != claimer && entries > own)
            .map(|(_, tag)| tag);
        let oldest_of = |tag: u64| Some(self.scopes.get(&tag)?.oldest_completed()?.1);
        largest.and_then(oldest_of).or_else(|| oldest_of(claimer))
    }

    /// Makes `size` more bytes fit in `max` by dropping the responses of completed records
    /// (their keys stay, not replayable), each from the scope holding the most bytes if it
    /// holds strictly more than `claimer`, else from the claimer's own oldest; `false` if they
    /// do not fit even then. The responses dropped are returned, to be freed once the lock is
    /// released.
    pub(super) fn make_room_for_bytes(
        &mut self,
        claimer: u64,
        size: usize,
        max: usize,
        freed: &mut Vec<Arc<StoredResponse>>,
    ) -> bool {
        while self.bytes + size > max {
            let own = self.scopes.get(&claimer).map_or(0, |usage| usage.bytes);
            let scopes = &self.scopes;
            // The scope holding the most bytes pays if it holds strictly more than the claimer.
            let payer = match top(&mut self.by_bytes, scopes, ScopeUse::bytes_rank) {
                Some((bytes, tag)) if bytes > own => tag,
                _ => claimer,
            };
            let Some((_, key)) = self
                .scopes
                .get(&payer)
                .and_then(ScopeUse::oldest_replayable)
            else {
                return false;
            };
            freed.extend(self.demote(&key));
        }
        true
    }

    /// Moves the lease of `token`'s claim under `key` to end at `until`; `false` if `token`
    /// holds no claim on `key`.
    pub(super) fn extend(&mut self, key: &StoreKey, token: ClaimToken, until: Instant) -> bool {
        let Some(entry) = self.owned_by(key, token) else {
            return false;
        };
        let old = std::mem::replace(&mut entry.expires_at, until);
        self.leases.remove(&(old, *key));
        self.leases.insert((until, *key));
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
    /// that a live record never pays while an expired one stays. The scopes are met soonest
    /// expiry first, so only those holding an expired record are visited.
    pub(super) fn purge_all_expired(&mut self, now: Instant) {
        loop {
            let scopes = &self.scopes;
            let Some((Reverse(at), scope)) =
                top(&mut self.by_expiry, scopes, ScopeUse::expiry_rank)
            else {
                break;
            };
            if at > now {
                break;
            }
            // Drops at least that record: each turn makes progress.
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

type Scopes = HashMap<u64, ScopeUse, BuildHasherDefault<TagHasher>>;

/// Pushes `scope`'s current rank, as `rank_of` gives it, to `ranking` (nothing if it ranks
/// nowhere).
fn rank<R: Ord + Copy>(
    ranking: &mut Ranking<R>,
    scopes: &Scopes,
    scope: u64,
    rank_of: impl Fn(&ScopeUse) -> Option<R> + Copy,
) {
    let Some(rank) = scopes.get(&scope).and_then(rank_of) else {
        return;
    };
    ranking.push(rank, scope, scopes.len(), || {
        scopes
            .iter()
            .filter_map(move |(tag, usage)| Some((rank_of(usage)?, *tag)))
    });
}

/// The highest-ranked scope of `ranking` whose rank, as `rank_of` gives it, is still current.
fn top<R: Ord + Copy>(
    ranking: &mut Ranking<R>,
    scopes: &Scopes,
    rank_of: impl Fn(&ScopeUse) -> Option<R>,
) -> Option<(R, u64)> {
    ranking.top(|tag| scopes.get(&tag).and_then(&rank_of))
}
