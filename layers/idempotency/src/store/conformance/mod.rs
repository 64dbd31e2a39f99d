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

use super::{ClaimOutcome, ClaimToken, IdempotencyStore, RecordState, StoreKey};
use crate::fingerprint::Fingerprint;
use std::future::Future;
use std::time::Duration;

mod rules;

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
