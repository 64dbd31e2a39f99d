//! What tests read of a shard (test-only): its records, what each scope holds, the size of
//! its heaps, and a check of every index and count against its records.

use super::{Shard, State};
use crate::store::StoreKey;
use std::collections::{BTreeSet, HashMap};

impl Shard {
    /// Every record held, expired ones that were not dropped yet included.
    pub(in crate::store::memory) fn records(
        &self,
    ) -> impl Iterator<Item = (&StoreKey, &super::Entry)> {
        self.map.iter()
    }

    /// The scopes that hold a record.
    pub(in crate::store::memory) fn scope_count(&self) -> usize {
        self.scopes.len()
    }

    /// What `scope` holds: (entries, bytes), `None` when it holds no record.
    pub(in crate::store::memory) fn held(&self, scope: u64) -> Option<(usize, usize)> {
        self.scopes.get(&scope).map(|u| (u.entries, u.bytes))
    }

    /// What every scope holds: (tag, (entries, bytes)).
    pub(in crate::store::memory) fn holdings(
        &self,
    ) -> impl Iterator<Item = (u64, (usize, usize))> + '_ {
        self.scopes
            .iter()
            .map(|(tag, u)| (*tag, (u.entries, u.bytes)))
    }

    /// The pairs each heap holds, stale ones included: by entries, by bytes, by expiry.
    pub(in crate::store::memory) fn heap_lens(&self) -> [usize; 3] {
        [
            self.by_entries.len(),
            self.by_bytes.len(),
            self.by_expiry.len(),
        ]
    }

    /// Recomputes every index and count from `map` and panics, naming what disagrees, when the
    /// shard's bookkeeping does not match its records (test-only).
    pub(in crate::store::memory) fn check_invariants(
        &self,
        max_entries: usize,
        max_bytes: usize,
        context: &str,
    ) {
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
            assert!(
                self.by_entries.holds(usage.entries_rank(), tag),
                "{context}: scope {tag}'s rank by entries is missing"
            );
            assert!(
                usage
                    .bytes_rank()
                    .is_none_or(|rank| self.by_bytes.holds(rank, tag)),
                "{context}: scope {tag}'s rank by bytes is missing"
            );
            assert!(
                usage
                    .expiry_rank()
                    .is_none_or(|rank| self.by_expiry.holds(rank, tag)),
                "{context}: scope {tag}'s rank by expiry is missing"
            );
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
