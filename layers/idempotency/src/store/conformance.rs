//! A reusable test suite for [`IdempotencyStore`] implementations (feature `conformance`).
//!
//! Every check uses fresh random keys, so the suite can share a store (a Redis database, say)
//! with other tests. A failed check panics with the rule it broke, so call it from a test.
//!
//! Expiry checks need time to pass. The suite asks a [`Clock`] to advance it: for a store on
//! tokio's clock (like [`MemoryStore`](super::MemoryStore)) that is
//! [`PausedClock`], under `#[tokio::test(start_paused = true)]`; for a server with its own clock
//! (Redis), a clock that really waits, together with a short `lease` in [`Suite`].
//!
//! ```
//! use std::time::Duration;
//! use tower_once_idempotency::store::conformance::{PausedClock, Suite};
//! use tower_once_idempotency::store::MemoryStore;
//!
//! #[tokio::test(start_paused = true)]
//! async fn memory_store_keeps_the_contract() {
//!     Suite::new(MemoryStore::new(), PausedClock).run().await;
//! }
//! ```

use super::{
    ClaimOutcome, ClaimToken, Completion, IdempotencyStore, RecordState, StoreKey, StoredResponse,
};
use crate::fingerprint::Fingerprint;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode};
use std::future::Future;
use std::time::Duration;

/// Makes time pass for the store under test.
pub trait Clock {
    /// Returns once the store's clock has moved forward by at least `by`.
    fn advance(&self, by: Duration) -> impl Future<Output = ()> + Send;
}

/// Advances tokio's paused clock; use under `#[tokio::test(start_paused = true)]`.
#[derive(Debug, Clone, Copy, Default)]
pub struct PausedClock;

impl Clock for PausedClock {
    async fn advance(&self, by: Duration) {
        tokio::time::advance(by).await;
    }
}

/// Waits in real time, for stores with their own clock (such as a Redis server).
#[derive(Debug, Clone, Copy, Default)]
pub struct RealClock;

impl Clock for RealClock {
    async fn advance(&self, by: Duration) {
        tokio::time::sleep(by).await;
    }
}

/// The conformance suite for one store.
#[derive(Debug)]
pub struct Suite<St, C> {
    store: St,
    clock: C,
    lease: Duration,
    retention: Duration,
    concurrency: usize,
}

impl<St: IdempotencyStore, C: Clock> Suite<St, C> {
    /// A suite with a 10 s lease, a 60 s retention and 64 concurrent claimers.
    pub fn new(store: St, clock: C) -> Self {
        Self {
            store,
            clock,
            lease: Duration::from_secs(10),
            retention: Duration::from_secs(60),
            concurrency: 64,
        }
    }

    /// The lease and retention the checks use; keep them short for a [`RealClock`].
    pub fn durations(mut self, lease: Duration, retention: Duration) -> Self {
        self.lease = lease;
        self.retention = retention;
        self
    }

    /// How many tasks race to claim one key.
    pub fn concurrency(mut self, tasks: usize) -> Self {
        self.concurrency = tasks;
        self
    }

    /// Runs every check, panicking at the first broken rule.
    pub async fn run(&self) {
        self.claim_is_exclusive().await;
        self.concurrent_claims_have_one_winner().await;
        self.complete_round_trips_the_response().await;
        self.not_replayable_is_kept().await;
        self.writes_are_fenced_by_token().await;
        self.completed_records_cannot_be_released_or_extended()
            .await;
        self.release_frees_the_key().await;
        self.extend_renews_the_lease().await;
        self.lease_expiry_frees_the_key_and_fences_the_old_owner()
            .await;
        self.retention_expiry_frees_the_key().await;
        self.keys_are_independent().await;
    }

    async fn claim(&self, key: StoreKey, token: ClaimToken, fp: Fingerprint) -> ClaimOutcome {
        match self.store.claim(key, token, fp, self.lease).await {
            Ok(outcome) => outcome,
            Err(e) => panic!("claim failed: {e} ({:?})", std::error::Error::source(&e)),
        }
    }

    async fn state(&self, key: StoreKey) -> Option<(Fingerprint, RecordState)> {
        // A probe claim never wins on a held key; on a free key it wins and is released again.
        let probe = ClaimToken::new();
        match self.claim(key, probe, fingerprint(0xee)).await {
            ClaimOutcome::Existing(record) => Some((record.fingerprint, record.state)),
            ClaimOutcome::Claimed => {
                assert!(
                    ok(self.store.release(key, probe).await),
                    "release of a probe claim"
                );
                None
            }
        }
    }

    /// Rule 1: a claimed key is held; a second claim sees it in progress, with its fingerprint.
    pub async fn claim_is_exclusive(&self) {
        let (key, token) = (random_key(), ClaimToken::new());
        assert!(matches!(
            self.claim(key, token, fingerprint(1)).await,
            ClaimOutcome::Claimed
        ));
        match self.claim(key, ClaimToken::new(), fingerprint(2)).await {
            ClaimOutcome::Existing(record) => {
                assert_eq!(
                    record.fingerprint,
                    fingerprint(1),
                    "the first claim's fingerprint"
                );
                match record.state {
                    RecordState::InProgress { lease_remaining } => {
                        assert!(
                            lease_remaining <= self.lease,
                            "lease_remaining within the lease"
                        )
                    }
                    other => panic!("a claimed key must be in progress, got {other:?}"),
                }
            }
            ClaimOutcome::Claimed => panic!("a held key was claimed twice"),
        }
    }

    /// Rule 1: of many concurrent claims of one key, exactly one wins.
    pub async fn concurrent_claims_have_one_winner(&self) {
        let key = random_key();
        let tasks: Vec<_> = (0..self.concurrency)
            .map(|_| {
                let store = self.store.clone();
                let lease = self.lease;
                tokio::spawn(async move {
                    store
                        .claim(key, ClaimToken::new(), fingerprint(1), lease)
                        .await
                })
            })
            .collect();
        let mut winners = 0;
        for task in tasks {
            match task.await {
                Ok(Ok(ClaimOutcome::Claimed)) => winners += 1,
                Ok(Ok(ClaimOutcome::Existing(_))) => {}
                Ok(Err(e)) => panic!("claim failed: {e}"),
                Err(e) => panic!("claim task failed: {e}"),
            }
        }
        assert_eq!(winners, 1, "exactly one concurrent claim wins");
    }

    /// Rule 3: status, repeated headers in order, binary body and trailers come back unchanged.
    pub async fn complete_round_trips_the_response(&self) {
        let (key, token) = (random_key(), ClaimToken::new());
        assert!(matches!(
            self.claim(key, token, fingerprint(3)).await,
            ClaimOutcome::Claimed
        ));
        let mut headers = HeaderMap::new();
        headers.insert(
            "content-type",
            HeaderValue::from_static("application/octet-stream"),
        );
        headers.append("set-cookie", HeaderValue::from_static("a=1"));
        headers.append("set-cookie", HeaderValue::from_static("b=2"));
        headers.insert(
            "x-binary",
            HeaderValue::from_bytes(&[0x80, 0xff, b'a'])
                .unwrap_or_else(|_| HeaderValue::from_static("x")),
        );
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from_static("0"));
        let body: Bytes = (0..=255u8)
            .cycle()
            .take(256 * 1024 + 7)
            .collect::<Vec<_>>()
            .into();
        let stored =
            StoredResponse::new(StatusCode::ACCEPTED, headers, body).with_trailers(trailers);

        let completion = Completion::Response(stored.clone());
        assert!(ok(self
            .store
            .complete(key, token, completion, self.retention)
            .await));
        match self.state(key).await {
            Some((fp, RecordState::Completed(back))) => {
                assert_eq!(fp, fingerprint(3), "the fingerprint survives completion");
                assert_eq!(back.status, stored.status);
                assert_eq!(back.headers, stored.headers);
                assert_eq!(
                    back.headers
                        .get_all("set-cookie")
                        .iter()
                        .collect::<Vec<_>>(),
                    ["a=1", "b=2"],
                    "repeated headers keep their order"
                );
                assert_eq!(back.body, stored.body, "the body round-trips byte for byte");
                assert_eq!(back.trailers, stored.trailers);
            }
            other => panic!("expected a completed record, got {other:?}"),
        }
    }

    /// Rule 3: a not-replayable completion holds the key without a response.
    pub async fn not_replayable_is_kept(&self) {
        let (key, token) = (random_key(), ClaimToken::new());
        self.claim(key, token, fingerprint(4)).await;
        let done = self
            .store
            .complete(key, token, Completion::NotReplayable, self.retention);
        assert!(ok(done.await));
        assert!(matches!(
            self.state(key).await,
            Some((_, RecordState::NotReplayable))
        ));
    }

    /// Rule 2: complete, release and extend with another token change nothing.
    pub async fn writes_are_fenced_by_token(&self) {
        let (key, token) = (random_key(), ClaimToken::new());
        self.claim(key, token, fingerprint(5)).await;
        let other = ClaimToken::new();
        let response = Completion::Response(StoredResponse::new(
            StatusCode::OK,
            HeaderMap::new(),
            Bytes::from_static(b"stolen"),
        ));
        assert!(!ok(self
            .store
            .complete(key, other, response, self.retention)
            .await));
        assert!(!ok(self.store.release(key, other).await));
        assert!(!ok(self.store.extend(key, other, self.lease).await));
        assert!(matches!(
            self.state(key).await,
            Some((_, RecordState::InProgress { .. }))
        ));
        // Operations on a key nobody holds are refused too.
        let absent = random_key();
        assert!(!ok(self.store.release(absent, token).await));
        assert!(!ok(self.store.extend(absent, token, self.lease).await));
        let completion = Completion::NotReplayable;
        assert!(!ok(self
            .store
            .complete(absent, token, completion, self.retention)
            .await));
        assert!(
            self.state(absent).await.is_none(),
            "a refused complete must not create a record"
        );
    }

    /// Rule 2: the owner itself cannot release, extend or re-complete a completed record.
    pub async fn completed_records_cannot_be_released_or_extended(&self) {
        let (key, token) = (random_key(), ClaimToken::new());
        self.claim(key, token, fingerprint(6)).await;
        let first = Completion::Response(StoredResponse::new(
            StatusCode::OK,
            HeaderMap::new(),
            Bytes::from_static(b"first"),
        ));
        assert!(ok(self
            .store
            .complete(key, token, first, self.retention)
            .await));
        assert!(!ok(self.store.release(key, token).await));
        assert!(!ok(self.store.extend(key, token, self.lease).await));
        let second = Completion::Response(StoredResponse::new(
            StatusCode::OK,
            HeaderMap::new(),
            Bytes::from_static(b"second"),
        ));
        assert!(!ok(self
            .store
            .complete(key, token, second, self.retention)
            .await));
        match self.state(key).await {
            Some((_, RecordState::Completed(r))) => assert_eq!(r.body, "first"),
            other => panic!("expected the first completion, got {other:?}"),
        }
    }

    /// A released key can be claimed again.
    pub async fn release_frees_the_key(&self) {
        let (key, token) = (random_key(), ClaimToken::new());
        self.claim(key, token, fingerprint(7)).await;
        assert!(ok(self.store.release(key, token).await));
        assert!(
            !ok(self.store.release(key, token).await),
            "a second release finds nothing"
        );
        assert!(matches!(
            self.claim(key, ClaimToken::new(), fingerprint(8)).await,
            ClaimOutcome::Claimed
        ));
    }

    /// Rule 4: an extended lease outlives the original one.
    pub async fn extend_renews_the_lease(&self) {
        let (key, token) = (random_key(), ClaimToken::new());
        self.claim(key, token, fingerprint(9)).await;
        self.clock.advance(self.lease * 3 / 5).await;
        assert!(ok(self.store.extend(key, token, self.lease).await));
        self.clock.advance(self.lease * 3 / 5).await;
        // 1.2 leases after the claim, 0.6 after the renewal: still held.
        assert!(matches!(
            self.state(key).await,
            Some((_, RecordState::InProgress { .. }))
        ));
        assert!(ok(self.store.release(key, token).await));
    }

    /// Rule 4 and 2: a lapsed lease frees the key; the old owner can no longer write.
    pub async fn lease_expiry_frees_the_key_and_fences_the_old_owner(&self) {
        let (key, old) = (random_key(), ClaimToken::new());
        self.claim(key, old, fingerprint(10)).await;
        self.clock.advance(self.lease + self.lease / 2).await;
        let new = ClaimToken::new();
        assert!(
            matches!(
                self.claim(key, new, fingerprint(10)).await,
                ClaimOutcome::Claimed
            ),
            "a key whose lease lapsed is free"
        );
        let stale = Completion::NotReplayable;
        assert!(!ok(self
            .store
            .complete(key, old, stale, self.retention)
            .await));
        assert!(!ok(self.store.release(key, old).await));
        assert!(matches!(
            self.state(key).await,
            Some((_, RecordState::InProgress { .. }))
        ));
        assert!(ok(self.store.release(key, new).await));
    }

    /// Rule 4: a completed record disappears after its retention.
    pub async fn retention_expiry_frees_the_key(&self) {
        let (key, token) = (random_key(), ClaimToken::new());
        self.claim(key, token, fingerprint(11)).await;
        let retention = self.lease;
        let done = self
            .store
            .complete(key, token, Completion::NotReplayable, retention);
        assert!(ok(done.await));
        self.clock.advance(retention / 2).await;
        assert!(self.state(key).await.is_some(), "kept within its retention");
        self.clock.advance(retention).await;
        assert!(self.state(key).await.is_none(), "gone after its retention");
    }

    /// Keys do not interfere with each other.
    pub async fn keys_are_independent(&self) {
        let (a, b) = (random_key(), random_key());
        let (ta, tb) = (ClaimToken::new(), ClaimToken::new());
        assert!(matches!(
            self.claim(a, ta, fingerprint(12)).await,
            ClaimOutcome::Claimed
        ));
        assert!(matches!(
            self.claim(b, tb, fingerprint(12)).await,
            ClaimOutcome::Claimed
        ));
        assert!(ok(self.store.release(a, ta).await));
        assert!(matches!(
            self.state(b).await,
            Some((_, RecordState::InProgress { .. }))
        ));
        assert!(ok(self.store.release(b, tb).await));
    }
}

fn ok(result: Result<bool, super::StoreError>) -> bool {
    match result {
        Ok(done) => done,
        Err(e) => panic!("store operation failed: {e}"),
    }
}

fn fingerprint(n: u8) -> Fingerprint {
    Fingerprint::from_bytes([n; 32])
}

fn random_key() -> StoreKey {
    let mut bytes = [0; 32];
    bytes[..16].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
    bytes[16..].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
    StoreKey::from_bytes(bytes)
}
