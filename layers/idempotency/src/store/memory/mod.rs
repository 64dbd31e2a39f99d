mod shard;

use self::shard::{Entry, Shard, State};
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
/// - **bytes of stored responses** (default 256 MiB): completing a record evicts the completed
///   records closest to expiry until the new response fits. A response that cannot fit even then
///   is kept as *not replayable*: its duplicates get an error, never a second run.
///
/// Both bounds are split evenly over the shards (up to 16; fewer for small stores, so that each
/// shard holds at least 256 entries), so a single response larger than `max_bytes / shards` is
/// kept as not replayable — and then evicts nothing: a response that cannot fit costs no other
/// record its place.
///
/// **Fair between scopes.** When room must be made, the [scope](crate::scope) that holds the
/// most (entries, or bytes for the byte bound) pays with its oldest completed record; if it
/// has none to give (only claims in progress), the claimer pays with one of its own, and gets
/// [`StoreError::full`] (`503`) when it has none either — never a bystander. So a tenant flooding the store with
/// fresh keys only ever evicts its own records, never another tenant's completed payment. The
/// rule applies per shard; finding the largest scope costs a scan of the shard's scopes, paid
/// only when the store is full.
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
        self.inner.shards.iter().map(|s| lock(s).map.len()).sum()
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
        let mut shard = self.shard(&key);
        shard.purge_expired(now);
        if let Some(entry) = shard.map.get(&key) {
            let fingerprint = entry.fingerprint;
            let state = match &entry.state {
                State::InProgress { .. } => RecordState::InProgress {
                    lease_remaining: entry.expires_at.saturating_duration_since(now),
                },
                State::Completed { response, .. } => {
                    // The response (header map and all) is copied after the lock is released.
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
        let scope = key.scope_tag();
        if shard.map.len() >= self.inner.max_entries_per_shard {
            match shard.victim(scope, |u| u.entries, |u| &u.completed) {
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
        shard.purge_expired(now);
        let Some(scope) = shard.owned_by(&key, token).map(|e| e.scope) else {
            return false;
        };
        // NOTE: the handler already ran; keeping the key (without its response) is what
        // guarantees a duplicate never runs it again. A response that cannot fit even in an
        // empty shard evicts nothing.
        if state.size() > self.inner.max_bytes_per_shard {
            state = State::NotReplayable;
        }
        // Victims are completed records, never this claim in progress.
        while shard.bytes + state.size() > self.inner.max_bytes_per_shard {
            match shard.victim(scope, |u| u.bytes, |u| &u.replayable) {
                Some(victim) => drop(shard.remove(&victim)),
                None => {
                    state = State::NotReplayable;
                    break;
                }
            }
        }
        shard.complete(&key, state, saturating_add(now, retention))
    }

    fn do_release(&self, key: StoreKey, token: ClaimToken) -> bool {
        let mut shard = self.shard(&key);
        shard.purge_expired(Instant::now());
        if shard.owned_by(&key, token).is_none() {
            return false;
        }
        shard.remove(&key);
        true
    }

    fn do_extend(&self, key: StoreKey, token: ClaimToken, lease: Duration) -> bool {
        let now = Instant::now();
        let mut shard = self.shard(&key);
        shard.purge_expired(now);
        let Some(entry) = shard.owned_by(&key, token) else {
            return false;
        };
        let old = entry.expires_at;
        let new = saturating_add(now, lease);
        entry.expires_at = new;
        shard.leases.remove(&(old, key));
        shard.leases.insert((new, key));
        true
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

#[cfg(test)]
mod tests {
    use super::*;
    use http::StatusCode;

    fn key(n: u8) -> StoreKey {
        StoreKey::from_bytes([n; 32])
    }

    const FP: Fingerprint = Fingerprint::from_bytes([9; 32]);
    const LEASE: Duration = Duration::from_secs(10);
    const DAY: Duration = Duration::from_secs(86_400);

    fn response(len: usize) -> Completion {
        Completion::Response(StoredResponse::new(
            StatusCode::OK,
            Default::default(),
            vec![b'x'; len].into(),
        ))
    }

    #[tokio::test(start_paused = true)]
    async fn full_of_claims_refuses_and_evicts_completed_first() {
        let store = MemoryStore::builder().max_entries(2).build();
        let (t1, t2) = (ClaimToken::new(), ClaimToken::new());
        assert!(matches!(
            store.do_claim(key(1), t1, FP, LEASE),
            Ok(ClaimOutcome::Claimed)
        ));
        assert!(matches!(
            store.do_claim(key(2), t2, FP, LEASE),
            Ok(ClaimOutcome::Claimed)
        ));
        let err = store
            .do_claim(key(3), ClaimToken::new(), FP, LEASE)
            .unwrap_err();
        assert!(err.is_full(), "in-progress claims are never evicted");
        assert_eq!(store.len(), 2);

        assert!(store.do_complete(key(1), t1, response(10), DAY));
        let t3 = ClaimToken::new();
        assert!(matches!(
            store.do_claim(key(3), t3, FP, LEASE),
            Ok(ClaimOutcome::Claimed)
        ));
        assert_eq!(store.len(), 2);
        // key 1 (completed) was evicted, key 2 (in progress) kept its claim.
        assert!(matches!(
            store.do_claim(key(1), ClaimToken::new(), FP, LEASE),
            Err(e) if e.is_full()
        ));
        assert!(store.do_release(key(2), t2));
    }

    #[tokio::test(start_paused = true)]
    async fn byte_bound_evicts_old_responses_then_keeps_key_unreplayable() {
        // Few entries: one shard, so the whole byte budget applies to these keys.
        let store = MemoryStore::builder()
            .max_entries(10)
            .max_bytes(1_000)
            .build();
        let (t1, t2, t3) = (ClaimToken::new(), ClaimToken::new(), ClaimToken::new());
        store.do_claim(key(1), t1, FP, LEASE).unwrap();
        assert!(store.do_complete(key(1), t1, response(600), DAY));
        store.do_claim(key(2), t2, FP, LEASE).unwrap();
        assert!(store.do_complete(key(2), t2, response(600), DAY));
        // key 1 made room for key 2.
        assert!(matches!(
            store.do_claim(key(1), ClaimToken::new(), FP, LEASE),
            Ok(ClaimOutcome::Claimed)
        ));
        store.do_claim(key(3), t3, FP, LEASE).unwrap();
        assert!(store.do_complete(key(3), t3, response(5_000), DAY));
        match store.do_claim(key(3), ClaimToken::new(), FP, LEASE) {
            Ok(ClaimOutcome::Existing(r)) => assert!(matches!(r.state, RecordState::NotReplayable)),
            other => panic!("expected a not-replayable record, got {other:?}"),
        }
        assert!(store.inner.shards.iter().all(|s| lock(s).bytes <= 1_000));
    }

    #[tokio::test(start_paused = true)]
    async fn expired_entries_are_purged_with_their_bytes() {
        let store = MemoryStore::new();
        for n in 0..50 {
            let t = ClaimToken::new();
            store.do_claim(key(n), t, FP, LEASE).unwrap();
            if n % 2 == 0 {
                assert!(store.do_complete(key(n), t, response(100), Duration::from_secs(60)));
            }
        }
        tokio::time::advance(Duration::from_secs(61)).await;
        // Any operation on a shard purges it; touch every shard through a fresh claim.
        for n in 100..=255 {
            let _ = store.do_claim(key(n), ClaimToken::new(), FP, LEASE);
        }
        assert_eq!(store.len(), 156);
        assert!(store.inner.shards.iter().all(|s| lock(s).bytes == 0));
    }

    fn claimed(store: &MemoryStore, key: StoreKey) -> ClaimToken {
        let token = ClaimToken::new();
        assert!(matches!(
            store.do_claim(key, token, FP, LEASE),
            Ok(ClaimOutcome::Claimed)
        ));
        token
    }

    fn is_completed(store: &MemoryStore, key: StoreKey) -> bool {
        matches!(
            store.do_claim(key, ClaimToken::new(), FP, LEASE),
            Ok(ClaimOutcome::Existing(ExistingRecord {
                state: RecordState::Completed(_),
                ..
            }))
        )
    }

    #[tokio::test(start_paused = true)]
    async fn a_response_too_big_for_the_shard_evicts_nothing() {
        let store = MemoryStore::builder()
            .max_entries(10)
            .max_bytes(1_000)
            .build();
        let t1 = claimed(&store, key(1));
        assert!(store.do_complete(key(1), t1, response(600), DAY));
        let t2 = claimed(&store, key(2));
        assert!(store.do_complete(key(2), t2, response(5_000), DAY));
        assert!(
            is_completed(&store, key(1)),
            "the earlier response is still replayable"
        );
        match store.do_claim(key(2), ClaimToken::new(), FP, LEASE) {
            Ok(ClaimOutcome::Existing(r)) => assert!(matches!(r.state, RecordState::NotReplayable)),
            other => panic!("expected a not-replayable record, got {other:?}"),
        }
    }

    fn scoped(n: u32, scope: &[u8]) -> StoreKey {
        let mut bytes = [0; 32];
        bytes[..4].copy_from_slice(&n.to_le_bytes());
        bytes[4..4 + scope.len().min(28)].copy_from_slice(&scope[..scope.len().min(28)]);
        StoreKey::from_bytes(bytes).with_scope(scope)
    }

    #[tokio::test(start_paused = true)]
    async fn a_flooding_scope_evicts_only_its_own_records() {
        let store = MemoryStore::builder().max_entries(1_000).build();
        let payment = scoped(0, b"tenant-b");
        let t = claimed(&store, payment);
        assert!(store.do_complete(payment, t, response(10), DAY));
        for n in 0..1_200 {
            let key = scoped(n, b"tenant-a");
            let t = claimed(&store, key);
            assert!(store.do_complete(key, t, response(10), DAY));
        }
        assert!(
            is_completed(&store, payment),
            "tenant B's completed payment survived tenant A's flood"
        );
        assert!(store.len() <= 1_000);
    }

    #[tokio::test(start_paused = true)]
    async fn a_small_scope_makes_room_at_the_largest_ones_expense() {
        let store = MemoryStore::builder().max_entries(4).build();
        for n in 0..4 {
            let key = scoped(n, b"a");
            let t = claimed(&store, key);
            assert!(store.do_complete(key, t, response(10), DAY));
        }
        // B holds nothing: A, the largest, pays its oldest record.
        claimed(&store, scoped(0, b"b"));
        assert!(!is_completed(&store, scoped(0, b"a")));
        assert!(is_completed(&store, scoped(3, b"a")));
    }

    #[tokio::test(start_paused = true)]
    async fn a_scope_holding_only_claims_is_refused_not_paid_for() {
        let store = MemoryStore::builder().max_entries(3).build();
        let done = scoped(0, b"b");
        let t = claimed(&store, done);
        assert!(store.do_complete(done, t, response(10), DAY));
        claimed(&store, scoped(0, b"a"));
        claimed(&store, scoped(1, b"a"));
        // A holds the most and has no completed record to give: it is refused.
        let err = store
            .do_claim(scoped(2, b"a"), ClaimToken::new(), FP, LEASE)
            .unwrap_err();
        assert!(err.is_full());
        assert!(is_completed(&store, done));
    }

    #[tokio::test(start_paused = true)]
    async fn huge_leases_and_retention_saturate_instead_of_panicking() {
        let store = MemoryStore::new();
        let t = ClaimToken::new();
        assert!(matches!(
            store.do_claim(key(1), t, FP, Duration::MAX),
            Ok(ClaimOutcome::Claimed)
        ));
        assert!(store.do_extend(key(1), t, Duration::MAX));
        assert!(store.do_complete(key(1), t, response(1), Duration::MAX));
        assert!(is_completed(&store, key(1)));
    }
}
