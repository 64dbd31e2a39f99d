mod rank;
#[cfg(test)]
mod rank_tests;
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
        let scope = key.scope_tag();
        let mut shard = self.shard(&key);
        shard.purge_expired(now, scope);
        match shard.map.get(&key) {
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
        if shard.map.len() >= self.inner.max_entries_per_shard {
            shard.purge_all_expired(now);
        }
        if shard.map.len() >= self.inner.max_entries_per_shard {
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
        if shard.bytes + state.size() > max {
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

    pub(super) const FP: Fingerprint = Fingerprint::from_bytes([9; 32]);
    pub(super) const LEASE: Duration = Duration::from_secs(10);
    pub(super) const DAY: Duration = Duration::from_secs(86_400);

    pub(super) fn response(len: usize) -> Completion {
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
    async fn byte_bound_drops_old_responses_but_keeps_their_keys() {
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
        // key 1 made room for key 2: its response went, its key stays (its handler ran).
        match store.do_claim(key(1), ClaimToken::new(), FP, LEASE) {
            Ok(ClaimOutcome::Existing(r)) => assert!(matches!(r.state, RecordState::NotReplayable)),
            other => panic!("expected key 1 kept as not replayable, got {other:?}"),
        }
        assert!(is_completed(&store, key(2)));
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

    pub(super) fn claimed(store: &MemoryStore, key: StoreKey) -> ClaimToken {
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

    pub(super) fn scoped(n: u32, scope: &[u8]) -> StoreKey {
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
    async fn a_quiet_scopes_expired_records_make_room_before_a_live_one_pays() {
        // Expired records are dropped per scope as scopes are used; a scope nobody uses any
        // more keeps its expired records until room is needed, and then they go first.
        let store = MemoryStore::builder().max_entries(4).build();
        for n in 0..2 {
            let key = scoped(n, b"quiet");
            let t = claimed(&store, key);
            assert!(store.do_complete(key, t, response(10), Duration::from_secs(60)));
        }
        for n in 0..2 {
            let key = scoped(n, b"busy");
            let t = claimed(&store, key);
            assert!(store.do_complete(key, t, response(10), DAY));
        }
        tokio::time::advance(Duration::from_secs(61)).await;
        assert_eq!(
            store.len(),
            4,
            "the quiet scope's records are past retention, not dropped"
        );
        // Full: the quiet scope's expired records make room; the busy scope's live ones stay.
        for n in 2..4 {
            claimed(&store, scoped(n, b"busy"));
        }
        assert!(is_completed(&store, scoped(0, b"busy")));
        assert!(is_completed(&store, scoped(1, b"busy")));
        assert_eq!(store.len(), 4);
        assert!(store.inner.shards.iter().all(|s| lock(s).scopes.len() == 1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_record_past_its_retention_is_never_answered() {
        // Its scope's tag differs from the one it was stored under (a store's own key): it is
        // still past its retention.
        let store = MemoryStore::new();
        let stored = scoped(7, b"a");
        let t = claimed(&store, stored);
        assert!(store.do_complete(stored, t, response(10), Duration::from_secs(5)));
        tokio::time::advance(Duration::from_secs(5)).await;
        let same_digest = StoreKey::from_bytes(*stored.as_bytes());
        assert!(matches!(
            store.do_claim(same_digest, ClaimToken::new(), FP, LEASE),
            Ok(ClaimOutcome::Claimed)
        ));
        assert_eq!(store.len(), 1);
    }

    /// HOLDS: exactly at its end, no record answers (no replay, no 409, no 422 from its
    /// fingerprint), whichever tag the key asking for it carries: its own scope's, another
    /// scope's, or tag 0 (`StoreKey::from_bytes`); and its scope's indices let it go.
    #[tokio::test(start_paused = true)]
    async fn no_record_answers_exactly_at_its_end_under_any_tag() {
        let other_fp = Fingerprint::from_bytes([1; 32]);
        for asked_as in [&b"a"[..], b"other", b""] {
            let store = MemoryStore::builder().max_entries(10).build();
            let (done, not_replayable, held) = (scoped(1, b"a"), scoped(2, b"a"), scoped(3, b"a"));
            let t = claimed(&store, done);
            assert!(store.do_complete(done, t, response(10), LEASE));
            let t = claimed(&store, not_replayable);
            assert!(store.do_complete(not_replayable, t, Completion::NotReplayable, LEASE));
            claimed(&store, held);
            tokio::time::advance(LEASE).await;
            for key in [done, not_replayable, held] {
                let asked = StoreKey::from_bytes(*key.as_bytes()).with_scope(asked_as);
                let answer = store.do_claim(asked, ClaimToken::new(), other_fp, LEASE);
                assert!(
                    matches!(answer, Ok(ClaimOutcome::Claimed)),
                    "{key:?} asked as {asked_as:?} at its end: {answer:?}"
                );
            }
            check_all(&store, "after the claims");
            assert_eq!(store.len(), 3);
        }
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

    /// The scopes `op` visits one by one (see `rank::SCOPE_VISITS`).
    fn visits_of<T>(op: impl FnOnce() -> T) -> (T, usize) {
        let before = rank::SCOPE_VISITS.with(std::cell::Cell::get);
        let out = op();
        (out, rank::SCOPE_VISITS.with(std::cell::Cell::get) - before)
    }

    /// Fills a one-shard store with one 100-byte response in each of `scopes` scopes (bytes
    /// full), and returns the keys.
    fn one_record_per_scope(store: &MemoryStore, scopes: u32) -> Vec<StoreKey> {
        (0..scopes)
            .map(|n| {
                let key = scoped(n, format!("tenant-{n}").as_bytes());
                let t = claimed(store, key);
                assert!(store.do_complete(key, t, response(36), DAY));
                key
            })
            .collect()
    }

    /// Was broken: `do_complete` chose each victim for bytes with `Shard::victim`, a scan of
    /// every scope of the shard, once per record it evicted. One response that needs the room
    /// of k records in a shard of s scopes cost k * s (here 200 * 200 scope visits under the
    /// shard's lock; with the default bounds a 1 MiB response over ~6 000 one-record tenants is
    /// millions), where the contract allows a scan of the scopes when full.
    #[tokio::test(start_paused = true)]
    async fn making_room_for_one_response_scans_the_scopes_a_bounded_number_of_times() {
        const SCOPES: u32 = 200;
        let store = MemoryStore::builder()
            .max_entries(500)
            .max_bytes(SCOPES as usize * 100)
            .build();
        assert_eq!(store.inner.shards.len(), 1);
        let bystanders = one_record_per_scope(&store, SCOPES);
        let big = scoped(0, b"big");
        let t = claimed(&store, big);
        let (done, visits) = visits_of(|| store.do_complete(big, t, response(200 * 100 - 64), DAY));
        assert!(done);
        check_all(&store, "after the big response");
        assert!(
            is_completed(&store, big),
            "the response fits once the others went"
        );
        assert!(bystanders.iter().all(|k| !is_completed(&store, *k)));
        assert_eq!(store.len(), SCOPES as usize + 1, "their keys are kept");
        assert!(
            visits <= 2 * SCOPES as usize,
            "one completion visited {visits} scopes (the shard holds {SCOPES})"
        );
    }

    /// HOLDS: room for bytes is taken from a larger scope only while it holds strictly more
    /// than the claimer: here B (300 + 200 bytes) pays its oldest for A (200 bytes), then,
    /// holding as much as A, keeps its other record while A pays with its own; C (100 bytes,
    /// smaller) is never touched.
    #[tokio::test(start_paused = true)]
    async fn byte_room_is_taken_from_a_larger_scope_only_while_it_holds_strictly_more() {
        let store = MemoryStore::builder()
            .max_entries(10)
            .max_bytes(1_000)
            .build();
        let mut stored = Vec::new();
        for (n, scope, len) in [
            (1, b"b", 236),
            (2, b"b", 136),
            (3, b"a", 136),
            (4, b"c", 36),
        ] {
            let key = scoped(n, scope);
            let t = claimed(&store, key);
            assert!(store.do_complete(key, t, response(len), DAY));
            stored.push(key);
            tokio::time::advance(Duration::from_secs(1)).await;
        }
        let [b_old, b_new, a_old, c] = stored[..] else {
            unreachable!()
        };
        let new = scoped(5, b"a");
        let t = claimed(&store, new);
        assert!(store.do_complete(new, t, response(636), DAY));
        check_all(&store, "after A's response");
        assert!(is_completed(&store, new), "A's response fits");
        assert!(!is_completed(&store, b_old), "B held more than A: it paid");
        assert!(
            !is_completed(&store, a_old),
            "then A held as much as B: A paid"
        );
        assert!(
            is_completed(&store, b_new),
            "B paid again while it held no more than A"
        );
        assert!(is_completed(&store, c), "C, smaller, paid");
    }

    /// Was broken: every claim in a full shard scanned all of its scopes twice (once for
    /// expired records, once for who pays), under the shard's lock. With one record per tenant
    /// (a scope per user) and the default bounds, a store full of ~6 000 scopes per shard cost
    /// about 1 ms per new key. Now the scopes are ranked as they change: what a claim or a
    /// completion visits is bounded per operation, amortized, however many scopes there are.
    #[tokio::test(start_paused = true)]
    async fn a_full_shard_of_many_scopes_is_never_scanned_per_operation() {
        const SCOPES: u32 = 500;
        let store = MemoryStore::builder()
            .max_entries(SCOPES as usize)
            .max_bytes(SCOPES as usize * 100)
            .build();
        assert_eq!(store.inner.shards.len(), 1);
        one_record_per_scope(&store, SCOPES);
        let ((), visits) = visits_of(|| {
            for n in 0..SCOPES {
                // A new tenant, a new key: room by entries, then by bytes.
                let key = scoped(n, format!("new-{n}").as_bytes());
                let t = claimed(&store, key);
                assert!(store.do_complete(key, t, response(36), DAY));
            }
        });
        check_all(&store, "after the new tenants");
        assert!(
            visits <= 8 * SCOPES as usize,
            "{SCOPES} claims and completions visited {visits} scopes"
        );
    }

    /// HOLDS: expired records in scopes nobody uses any more still make room first, and
    /// finding them visits no scope one by one.
    #[tokio::test(start_paused = true)]
    async fn expired_records_of_idle_scopes_make_room_without_a_scan() {
        let store = MemoryStore::builder().max_entries(300).build();
        for n in 0..300u32 {
            let key = scoped(n, format!("idle-{n}").as_bytes());
            let t = claimed(&store, key);
            let retention = if n % 2 == 0 {
                Duration::from_secs(60)
            } else {
                DAY
            };
            assert!(store.do_complete(key, t, response(10), retention));
        }
        tokio::time::advance(Duration::from_secs(61)).await;
        let ((), visits) = visits_of(|| {
            for n in 0..150u32 {
                claimed(&store, scoped(n, b"busy"));
            }
        });
        check_all(&store, "after the busy claims");
        for n in 0..300u32 {
            let key = scoped(n, format!("idle-{n}").as_bytes());
            assert_eq!(is_completed(&store, key), n % 2 == 1, "idle record {n}");
        }
        assert!(visits <= 8 * 150, "150 claims visited {visits} scopes");
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

    /// A small deterministic xorshift generator: random sequences without a new dependency.
    struct XorShift(u64);

    impl XorShift {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    /// The scopes of the random sequences' keys: the empty scope (tag 0) among them.
    const SCOPES: [&[u8]; 7] = [b"a", b"b", b"c", b"", b"d", b"e", b"f"];

    /// Keys in pairs that differ only in their last 16 bytes (one hash, two records), over
    /// `scopes` scopes and (with several shards) more than one shard.
    fn pool_key(i: usize, scopes: usize) -> StoreKey {
        let mut bytes = [0xab; 32];
        bytes[0] = (i / 2) as u8;
        bytes[16..].fill(0x10 + (i % 2) as u8);
        StoreKey::from_bytes(bytes).with_scope(SCOPES[i % scopes])
    }

    pub(super) fn check_all(store: &MemoryStore, context: &str) {
        for shard in store.inner.shards.iter() {
            lock(shard).check_invariants(
                store.inner.max_entries_per_shard,
                store.inner.max_bytes_per_shard,
                context,
            );
        }
    }

    /// What the shard of a key held before an operation: its live completed records (key,
    /// scope, replayable) and what each scope held (entries, bytes).
    struct Before {
        live: Vec<(StoreKey, u64, bool)>,
        held: std::collections::HashMap<u64, (usize, usize)>,
    }

    fn before(store: &MemoryStore, key: &StoreKey, now: Instant) -> Before {
        let shard = store.shard(key);
        let live = shard
            .map
            .iter()
            .filter(|(_, e)| e.expires_at > now && !matches!(e.state, State::InProgress { .. }))
            .map(|(k, e)| (*k, e.scope, matches!(e.state, State::Completed { .. })))
            .collect();
        let held = shard
            .scopes
            .iter()
            .map(|(tag, u)| (*tag, (u.entries, u.bytes)))
            .collect();
        Before { live, held }
    }

    /// Who made room in an operation: a fresh claim (room by entries) or a completion (room by
    /// bytes), of `key` whose record is in scope `claimer`.
    #[derive(Clone, Copy)]
    enum Room {
        Entries { claimer: u64 },
        Bytes { claimer: u64 },
    }

    /// Checks what an operation on `key` evicted against the share: a live record goes only
    /// when room was made, after every expired record went; for bytes only a record holding
    /// bytes; and only from the claimer's own scope or one that held strictly more than the
    /// claimer was left holding before its new record (what the claimer held when the victim
    /// was chosen is at least that, and the victim held at most what it held before).
    fn check_evictions(
        store: &MemoryStore,
        key: &StoreKey,
        now: Instant,
        before: &Before,
        room: Option<Room>,
        context: &str,
    ) {
        let shard = store.shard(key);
        let gone: Vec<_> = before
            .live
            .iter()
            .filter(|(k, ..)| !shard.map.contains_key(k))
            .collect();
        // Records that held a response and now hold none: what room for bytes takes.
        let demoted: Vec<_> = before
            .live
            .iter()
            .filter(|(k, _, replayable)| {
                *replayable
                    && *k != *key
                    && shard
                        .map
                        .get(k)
                        .is_some_and(|e| matches!(e.state, State::NotReplayable))
            })
            .collect();
        if let (Some(Room::Bytes { .. }), false) = (room, gone.is_empty()) {
            panic!("{context}: records {gone:?} forgotten to make room for bytes");
        }
        if !demoted.is_empty() && !matches!(room, Some(Room::Bytes { .. })) {
            panic!("{context}: responses of {demoted:?} dropped without room for bytes");
        }
        let gone: Vec<_> = gone.into_iter().chain(demoted).collect();
        if gone.is_empty() {
            return;
        }
        let Some(room) = room else {
            panic!("{context}: live records {gone:?} dropped by an operation that made no room");
        };
        // (The operation's own record may be born expired: a retention of zero.)
        for (k, e) in shard.map.iter().filter(|(k, _)| *k != key) {
            assert!(
                matches!(e.state, State::InProgress { .. }) || e.expires_at > now,
                "{context}: live records {gone:?} paid while {k:?} was past its retention"
            );
        }
        let (claimer, own) = match room {
            Room::Entries { claimer } => (claimer, shard.scopes[&claimer].entries - 1),
            Room::Bytes { claimer } => (
                claimer,
                shard.scopes[&claimer].bytes - shard.map[key].state.size(),
            ),
        };
        for (k, scope, replayable) in gone {
            if let Room::Bytes { .. } = room {
                assert!(replayable, "{context}: zero-byte {k:?} evicted for bytes");
            }
            if *scope == claimer {
                continue;
            }
            let (entries, bytes) = before.held[scope];
            let held = match room {
                Room::Entries { .. } => entries,
                Room::Bytes { .. } => bytes,
            };
            assert!(
                held > own,
                "{context}: {k:?} of a scope holding {held} paid for a claimer left holding {own}"
            );
        }
    }

    #[derive(Clone, Copy, Debug)]
    enum Model {
        Absent,
        Held {
            token: ClaimToken,
            lease_end: Instant,
        },
        Done {
            expires: Instant,
            replayable: bool,
        },
    }

    /// Runs `steps` random claim / complete / release / extend / expiry steps against `store`
    /// with keys of `scopes` scopes, checking after each one that the shard indices and byte
    /// counts agree with `map`, that every live claim is in the map under its token, that what
    /// was evicted respects the share (`check_evictions`), and against a model: a live claim is
    /// never lost (evicted), a stale or foreign token never writes, a completed record never
    /// outlives its retention (also when asked for under another scope's tag), and what is
    /// found is what was written.
    async fn random_sequence(store: MemoryStore, seed: u64, steps: usize, scopes: usize) {
        // With room for every key, the entry bound never evicts: a record can only go by
        // expiry, or (one holding bytes) for the byte bound.
        const KEYS: usize = 24;
        let roomy = store.inner.max_entries_per_shard >= KEYS;
        let mut rng = XorShift(seed);
        let mut model = [Model::Absent; KEYS];
        let mut stale: Vec<(usize, ClaimToken)> = Vec::new();
        for step in 0..steps {
            let i = rng.below(KEYS);
            let key = pool_key(i, scopes);
            let now = Instant::now();
            let op = rng.below(9);
            let context = format!("seed {seed} step {step} op {op} key {i}");
            let snapshot = before(&store, &key, now);
            let mut room = None;
            match op {
                0 | 1 => {
                    let token = ClaimToken::new();
                    let lease = Duration::from_secs([5, 30][rng.below(2)]);
                    // Now and then the same digest under another tag (a store's own key, tag
                    // 0, or another tenant's): the record's own scope still decides.
                    let asked = match rng.below(6) {
                        0 => StoreKey::from_bytes(*key.as_bytes()),
                        1 => key.with_scope(SCOPES[rng.below(SCOPES.len())]),
                        _ => key,
                    };
                    match store.do_claim(asked, token, FP, lease) {
                        Ok(ClaimOutcome::Claimed) => {
                            room = Some(Room::Entries {
                                claimer: asked.scope_tag(),
                            });
                            match model[i] {
                                Model::Held { lease_end, .. } => assert!(
                                    lease_end <= now,
                                    "{context}: a live claim was lost (evicted or dropped)"
                                ),
                                // Bytes never cost a record its key: with room for every
                                // key, a completed record goes only at its end.
                                Model::Done { expires, .. } if roomy => assert!(
                                    expires <= now,
                                    "{context}: a completed record was forgotten before its retention"
                                ),
                                Model::Done { .. } | Model::Absent => {}
                            }
                            if let Model::Held { token: old, .. } = model[i] {
                                stale.push((i, old));
                            }
                            model[i] = Model::Held {
                                token,
                                lease_end: saturating_add(now, lease),
                            };
                        }
                        Ok(ClaimOutcome::Existing(record)) => match (model[i], record.state) {
                            (Model::Held { lease_end, .. }, RecordState::InProgress { .. }) => {
                                assert!(lease_end > now, "{context}: an expired lease is kept")
                            }
                            (
                                Model::Done {
                                    expires,
                                    replayable,
                                },
                                state,
                            ) => {
                                assert!(
                                    expires > now,
                                    "{context}: a completed record outlived its retention"
                                );
                                match state {
                                    RecordState::Completed(_) => assert!(replayable, "{context}"),
                                    // Its response may have gone for bytes (checked by
                                    // `check_evictions` when it went); its key stays.
                                    RecordState::NotReplayable => {
                                        model[i] = Model::Done {
                                            expires,
                                            replayable: false,
                                        };
                                    }
                                    RecordState::InProgress { .. } => {
                                        panic!("{context}: completed record is in progress")
                                    }
                                }
                            }
                            (m, state) => panic!("{context}: model {m:?}, store {state:?}"),
                        },
                        Err(e) => {
                            assert!(e.is_full(), "{context}: {e:?}");
                            if let Model::Held { lease_end, .. } = model[i] {
                                assert!(lease_end <= now, "{context}: own live claim refused");
                            }
                        }
                    }
                }
                2 | 3 => {
                    let Model::Held { token, lease_end } = model[i] else {
                        // A token that never claimed this key never completes it.
                        let completed = store.do_complete(key, ClaimToken::new(), response(1), DAY);
                        assert!(!completed, "{context}: a foreign token completed a record");
                        check_evictions(&store, &key, now, &snapshot, None, &context);
                        check_all(&store, &context);
                        continue;
                    };
                    let (completion, size) = match rng.below(5) {
                        0 => (Completion::NotReplayable, None),
                        1 => (response(10), Some(74)),
                        2 => (response(200), Some(264)),
                        3 => (response(700), Some(764)),
                        _ => (response(5_000), Some(5_064)),
                    };
                    let retention = Duration::from_secs([0, 1, 20, 60, 300][rng.below(5)]);
                    let claimer = store.shard(&key).map.get(&key).map(|e| e.scope);
                    let done = store.do_complete(key, token, completion, retention);
                    assert_eq!(done, lease_end > now, "{context}: complete (lease live?)");
                    if done {
                        room = claimer.map(|claimer| Room::Bytes { claimer });
                        let replayable = {
                            let shard = store.shard(&key);
                            let entry = shard.map.get(&key).expect("just completed");
                            assert_eq!(
                                entry.expires_at,
                                saturating_add(now, retention),
                                "{context}: retention"
                            );
                            match entry.state {
                                State::Completed { .. } => true,
                                State::NotReplayable => false,
                                State::InProgress { .. } => panic!("{context}: still a claim"),
                            }
                        };
                        // Every record holding bytes can be made to pay (its own scope's when
                        // no larger one): a response that fits the shard is always kept.
                        // (Unless it is born at its end: a retention of zero.)
                        if size.is_some_and(|size| size <= store.inner.max_bytes_per_shard)
                            && !retention.is_zero()
                        {
                            assert!(replayable, "{context}: a response that fits was dropped");
                        }
                        model[i] = Model::Done {
                            expires: saturating_add(now, retention),
                            replayable,
                        };
                    } else {
                        model[i] = Model::Absent;
                    }
                }
                4 => {
                    if let Model::Held { token, lease_end } = model[i] {
                        let released = store.do_release(key, token);
                        assert_eq!(released, lease_end > now, "{context}: release");
                        model[i] = Model::Absent;
                    }
                }
                5 => {
                    if let Model::Held { token, lease_end } = model[i] {
                        let lease = Duration::from_secs([5, 30][rng.below(2)]);
                        let extended = store.do_extend(key, token, lease);
                        assert_eq!(extended, lease_end > now, "{context}: extend");
                        if extended {
                            model[i] = Model::Held {
                                token,
                                lease_end: saturating_add(now, lease),
                            };
                        } else {
                            model[i] = Model::Absent;
                        }
                    }
                }
                6 => {
                    // A claimer whose lease expired and whose key was taken over is fenced.
                    if let Some(&(j, old)) = stale.get(rng.below(stale.len().max(1))) {
                        let key = pool_key(j, scopes);
                        assert!(!store.do_extend(key, old, LEASE), "{context}: stale extend");
                        assert!(
                            !store.do_complete(key, old, response(10), DAY),
                            "{context}: stale complete"
                        );
                        assert!(!store.do_release(key, old), "{context}: stale release");
                    }
                }
                _ => {
                    // Up to past every retention at once: whole scopes expire unpurged.
                    let ms = [0, 500, 1_000, 4_999, 5_000, 10_000, 31_000, 61_000, 301_000]
                        [rng.below(9)];
                    tokio::time::advance(Duration::from_millis(ms)).await;
                }
            }
            check_evictions(&store, &key, now, &snapshot, room, &context);
            // Every live claim is in the map under its own token: none was evicted.
            let now = Instant::now();
            for (j, m) in model.iter().enumerate() {
                if let Model::Held { token, lease_end } = *m {
                    if lease_end > now {
                        let key = pool_key(j, scopes);
                        let shard = store.shard(&key);
                        assert!(
                            matches!(
                                shard.map.get(&key).map(|e| &e.state),
                                Some(State::InProgress { token: t }) if *t == token
                            ),
                            "{context}: live claim of key {j} is not in the map"
                        );
                    }
                }
            }
            check_all(&store, &context);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn random_sequences_keep_every_index_and_count_in_step_with_the_map() {
        for seed in 1..=8u64 {
            for scopes in [3, SCOPES.len()] {
                let seed = seed ^ (scopes as u64) << 40;
                // One shard, bounds hit constantly.
                let small = MemoryStore::builder()
                    .max_entries(8)
                    .max_bytes(1_000)
                    .build();
                random_sequence(
                    small,
                    seed.wrapping_mul(0x9e37_79b9_7f4a_7c15),
                    3_000,
                    scopes,
                )
                .await;
                // Room for every key; only the byte bound and expiry act.
                let roomy = MemoryStore::builder()
                    .max_entries(64)
                    .max_bytes(3_000)
                    .build();
                random_sequence(
                    roomy,
                    seed.wrapping_mul(0x2545_f491_4f6c_dd1d),
                    3_000,
                    scopes,
                )
                .await;
                // Two shards.
                let sharded = MemoryStore::builder()
                    .max_entries(512)
                    .max_bytes(2_000)
                    .build();
                assert_eq!(sharded.inner.shards.len(), 2);
                let seed = seed.wrapping_mul(0x1234_5678_9abc_def1) | 1;
                random_sequence(sharded, seed, 3_000, scopes).await;
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn keys_differing_only_in_their_last_16_bytes_are_two_records() {
        let store = MemoryStore::builder()
            .max_entries(10)
            .max_bytes(10_000)
            .build();
        let (a, b) = (pool_key(0, 3), pool_key(1, 3));
        assert_eq!(a.as_bytes()[..16], b.as_bytes()[..16]);
        assert_ne!(a, b);
        let ta = claimed(&store, a);
        let tb = claimed(&store, b);
        assert!(
            !store.do_complete(a, tb, response(10), DAY),
            "b's token on a"
        );
        assert!(store.do_complete(a, ta, response(10), DAY));
        match store.do_claim(b, ClaimToken::new(), FP, LEASE) {
            Ok(ClaimOutcome::Existing(r)) => {
                assert!(matches!(r.state, RecordState::InProgress { .. }))
            }
            other => panic!("b is still a claim, got {other:?}"),
        }
        assert!(store.do_extend(b, tb, DAY));
        assert!(store.do_complete(b, tb, Completion::NotReplayable, LEASE));
        assert!(is_completed(&store, a));
        check_all(&store, "after both completed");
        assert_eq!(store.len(), 2);
    }

    /// `Shard::complete` changes the record in place: its expiry must move from the (extended)
    /// lease to the retention in both indices, and the old claimer, once taken over, is fenced.
    #[tokio::test(start_paused = true)]
    async fn extend_then_complete_expires_at_the_retention_not_the_lease() {
        let store = MemoryStore::builder()
            .max_entries(10)
            .max_bytes(10_000)
            .build();
        let t = claimed(&store, key(1));
        assert!(store.do_extend(key(1), t, DAY));
        assert!(store.do_complete(key(1), t, response(100), Duration::from_secs(5)));
        check_all(&store, "completed");
        tokio::time::advance(Duration::from_secs(5)).await;
        let t2 = claimed(&store, key(1));
        check_all(&store, "reclaimed after retention");
        assert!(!store.do_complete(key(1), t, response(1), DAY), "old token");
        // The second claimer's lease runs out; a third takes over: the second is fenced.
        tokio::time::advance(LEASE).await;
        let t3 = claimed(&store, key(1));
        assert!(!store.do_extend(key(1), t2, LEASE));
        assert!(!store.do_complete(key(1), t2, response(1), DAY));
        assert!(!store.do_release(key(1), t2));
        assert!(store.do_complete(key(1), t3, response(1), DAY));
        check_all(&store, "third claimer completed");
        assert_eq!(lock(&store.inner.shards[0]).bytes, 65);
    }
}
