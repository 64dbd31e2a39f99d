mod entry;
mod rank;
mod shard;
#[cfg(test)]
mod tests;

use self::entry::{Entry, State};
use self::shard::Shard;
use super::{
    ClaimOutcome, ClaimToken, Completion, ExistingRecord, IdempotencyStore, RecordState,
    StoreError, StoreKey, StoredResponse,
};
use crate::fingerprint::Fingerprint;
use std::future::{ready, Ready};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;
use tokio::time::Instant;
use tower_once_core::time::saturating_add;

/// The in-process store: the default, for a single server process.
///
/// Records live in a sharded map guarded by short, never-awaited locks. It is bounded twice:
///
/// - **entries** (default 100 000): a claim of a new key when the store is full first drops
///   expired records, then evicts the *completed* record closest to expiry. It never evicts an
///   in-progress claim: when every entry is in progress the claim fails with
///   [`StoreError::full`], and the layer answers `503` with `Retry-After` without running the
///   handler.
/// - **bytes of stored responses** (default 256 MiB): completing a record drops the responses
///   of the completed records closest to expiry until the new response fits. Their keys stay,
///   as *not replayable*: their handlers ran, so a retry gets `409`, never a second run. A
///   response that cannot fit even then is kept as not replayable too.
///
/// Both bounds are split evenly over the shards (up to 16; fewer for small stores, so that each
/// shard holds at least 256 entries), so a single response larger than `max_bytes / shards` is
/// kept as not replayable — and then evicts nothing: a response that cannot fit costs no other
/// record its place.
///
/// **Fair between scopes.** When room must be made, the [scope](crate::scope) that holds the
/// most (entries, or bytes for the byte bound) pays with its oldest completed record (with
/// that record's response, for bytes); the
/// claimer's own scope counts as that scope whenever it holds as much as any other. If the
/// scope that pays has nothing to give (only claims in progress), the claimer pays with one of
/// its own, and gets [`StoreError::full`] (`503`) when it has none either — never a bystander.
/// So a tenant flooding the store with fresh keys can take room only from tenants holding more
/// than it; once it holds as much as any other, it evicts only its own records (or is refused),
/// never another tenant's completed payment. The rule applies per shard. Each shard keeps its
/// scopes ranked (by entries, by bytes, by first expiry) as they change, so a full store finds
/// who pays, and what expired, in logarithmic time however many scopes (tenants) it holds.
///
/// Time is read from tokio's clock ([`tokio::time::Instant`]), so tests with paused time can
/// expire leases and retention with `tokio::time::advance`.
///
/// It is written here rather than on a caching crate such as `moka` because the contract needs
/// what a cache does not offer: eviction that never touches an in-progress claim, an atomic
/// claim-or-get, per-record expiry that changes on every transition, and a byte bound that
/// degrades to "not replayable" instead of forgetting a key whose handler ran.
///
/// Records are lost when the process exits: with several replicas, or across restarts, use the
/// Redis store.
///
/// ```
/// use tower_once_idempotency::store::MemoryStore;
///
/// let store = MemoryStore::builder()
///     .max_entries(10_000)
///     .max_bytes(64 * 1024 * 1024)
///     .build();
/// assert_eq!(store.len(), 0);
/// ```
#[derive(Clone)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

struct Inner {
    shards: Box<[Mutex<Shard>]>,
    max_entries_per_shard: usize,
    max_bytes_per_shard: usize,
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("shards", &self.inner.shards.len())
            .field("max_entries_per_shard", &self.inner.max_entries_per_shard)
            .field("max_bytes_per_shard", &self.inner.max_bytes_per_shard)
            .field("len", &self.len())
            .finish()
    }
}

/// Builds a [`MemoryStore`] with custom bounds.
///
/// ```
/// use tower_once_idempotency::store::MemoryStore;
///
/// let store = MemoryStore::builder().max_entries(1_000).build();
/// # let _ = store;
/// ```
#[derive(Debug, Clone)]
pub struct MemoryStoreBuilder {
    max_entries: usize,
    max_bytes: usize,
}

impl MemoryStoreBuilder {
    /// The most records the store holds at once. Default 100 000.
    ///
    /// # Panics
    ///
    /// If `max` is zero.
    pub fn max_entries(mut self, max: usize) -> Self {
        assert!(max > 0, "MemoryStore::max_entries must be at least 1");
        self.max_entries = max;
        self
    }

    /// The most bytes of stored responses (headers, body and trailers) the store holds at once.
    /// Default 256 MiB.
    pub fn max_bytes(mut self, max: usize) -> Self {
        self.max_bytes = max;
        self
    }

    /// Builds the store.
    pub fn build(self) -> MemoryStore {
        // Enough shards to spread lock contention, few enough that each shard keeps a useful
        // share of the bounds (the bounds are split evenly, so a small store gets one shard and
        // exact bounds).
        let mut shards = 16;
        while shards > 1 && self.max_entries / shards < 256 {
            shards /= 2;
        }
        MemoryStore {
            inner: Arc::new(Inner {
                shards: (0..shards).map(|_| Mutex::new(Shard::default())).collect(),
                max_entries_per_shard: self.max_entries.div_ceil(shards),
                max_bytes_per_shard: self.max_bytes.div_ceil(shards),
            }),
        }
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    /// A store with the default bounds (100 000 entries, 256 MiB of responses).
    pub fn new() -> Self {
        Self::builder().build()
    }

    /// A builder for a store with custom bounds.
    pub fn builder() -> MemoryStoreBuilder {
        MemoryStoreBuilder {
            max_entries: 100_000,
            max_bytes: 256 * 1024 * 1024,
        }
    }

    /// The number of records held, expired ones that were not dropped yet included.
    pub fn len(&self) -> usize {
        self.inner.shards.iter().map(|s| lock(s).len()).sum()
    }

    /// Whether the store holds no record.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn shard(&self, key: &StoreKey) -> MutexGuard<'_, Shard> {
        let [a, b, c, d, ..] = *key.as_bytes();
        let index = u32::from_le_bytes([a, b, c, d]) as usize % self.inner.shards.len();
        lock(&self.inner.shards[index])
    }

    fn do_claim(
        &self,
        key: StoreKey,
        token: ClaimToken,
        fingerprint: Fingerprint,
        lease: Duration,
    ) -> Result<ClaimOutcome, StoreError> {
        // A record evicted to make room is dropped after the lock is released.
        let mut evicted = None;
        let now = Instant::now();
        let scope = key.scope_tag();
        let mut shard = self.shard(&key);
        shard.purge_expired(now, scope);
        match shard.get(&key) {
            None => {}
            // Past its retention (a key whose tag names another scope than its record's).
            Some(entry) if entry.expires_at <= now => evicted = shard.remove(&key),
            Some(entry) => {
                let fingerprint = entry.fingerprint;
                let state = match &entry.state {
                    State::InProgress { .. } => RecordState::InProgress {
                        lease_remaining: entry.expires_at.saturating_duration_since(now),
                    },
                    State::Completed { response, .. } => {
                        // The response (header map and all) is copied after the lock is
                        // released.
                        let response = Arc::clone(response);
                        drop(shard);
                        return Ok(ClaimOutcome::Existing(ExistingRecord {
                            fingerprint,
                            state: RecordState::Completed(StoredResponse::clone(&response)),
                        }));
                    }
                    State::NotReplayable => RecordState::NotReplayable,
                };
                return Ok(ClaimOutcome::Existing(ExistingRecord {
                    fingerprint,
                    state,
                }));
            }
        }
        if shard.len() >= self.inner.max_entries_per_shard {
            shard.purge_all_expired(now);
        }
        if shard.len() >= self.inner.max_entries_per_shard {
            match shard.victim(scope) {
                Some(victim) => evicted = shard.remove(&victim),
                None => return Err(StoreError::full()),
            }
        }
        shard.insert(
            key,
            Entry {
                fingerprint,
                scope,
                expires_at: saturating_add(now, lease),
                state: State::InProgress { token },
            },
        );
        drop(shard);
        drop(evicted);
        Ok(ClaimOutcome::Claimed)
    }

    fn do_complete(
        &self,
        key: StoreKey,
        token: ClaimToken,
        completion: Completion,
        retention: Duration,
    ) -> bool {
        // Sized and allocated before the lock is taken.
        let mut state = match completion {
            Completion::Response(response) => State::completed(response),
            Completion::NotReplayable => State::NotReplayable,
        };
        let now = Instant::now();
        let mut shard = self.shard(&key);
        shard.purge_expired(now, key.scope_tag());
        let Some(scope) = shard.owned_by(&key, token).map(|e| e.scope) else {
            return false;
        };
        // NOTE: the handler already ran; keeping the key (without its response) is what
        // guarantees a duplicate never runs it again. A response that cannot fit even in an
        // empty shard evicts nothing.
        if state.size() > self.inner.max_bytes_per_shard {
            state = State::NotReplayable;
        }
        // A record born at its end (a retention of zero) is never answered: its response would
        // only make live records pay for room nobody can use.
        let expires_at = saturating_add(now, retention);
        if expires_at <= now {
            state = State::NotReplayable;
        }
        // Completed records lose their responses (never their keys), never this claim in
        // progress; the responses are freed after the lock is released.
        let max = self.inner.max_bytes_per_shard;
        let mut freed = Vec::new();
        if shard.bytes() + state.size() > max {
            shard.purge_all_expired(now);
            if !shard.make_room_for_bytes(scope, state.size(), max, &mut freed) {
                state = State::NotReplayable;
            }
        }
        let done = shard.complete(&key, state, expires_at);
        drop(shard);
        drop(freed);
        done
    }

    fn do_release(&self, key: StoreKey, token: ClaimToken) -> bool {
        let mut shard = self.shard(&key);
        shard.purge_expired(Instant::now(), key.scope_tag());
        if shard.owned_by(&key, token).is_none() {
            return false;
        }
        shard.remove(&key);
        true
    }

    fn do_extend(&self, key: StoreKey, token: ClaimToken, lease: Duration) -> bool {
        let now = Instant::now();
        let mut shard = self.shard(&key);
        shard.purge_expired(now, key.scope_tag());
        shard.extend(&key, token, saturating_add(now, lease))
    }
}

impl IdempotencyStore for MemoryStore {
    type ClaimFuture = Ready<Result<ClaimOutcome, StoreError>>;
    type CompleteFuture = Ready<Result<bool, StoreError>>;
    type ReleaseFuture = Ready<Result<bool, StoreError>>;
    type ExtendFuture = Ready<Result<bool, StoreError>>;

    fn claim(
        &self,
        key: StoreKey,
        token: ClaimToken,
        fingerprint: Fingerprint,
        lease: Duration,
    ) -> Self::ClaimFuture {
        ready(self.do_claim(key, token, fingerprint, lease))
    }

    fn complete(
        &self,
        key: StoreKey,
        token: ClaimToken,
        completion: Completion,
        retention: Duration,
    ) -> Self::CompleteFuture {
        ready(Ok(self.do_complete(key, token, completion, retention)))
    }

    fn release(&self, key: StoreKey, token: ClaimToken) -> Self::ReleaseFuture {
        ready(Ok(self.do_release(key, token)))
    }

    fn extend(&self, key: StoreKey, token: ClaimToken, lease: Duration) -> Self::ExtendFuture {
        ready(Ok(self.do_extend(key, token, lease)))
    }
}

// A panic can only come from a bug in this module; the shard's indices are updated before any
// code that could panic, so a poisoned lock still guards consistent data.
fn lock(shard: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    shard.lock().unwrap_or_else(PoisonError::into_inner)
}
