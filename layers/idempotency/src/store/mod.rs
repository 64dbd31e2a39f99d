//! Where idempotency records live, and the contract a store must keep.
//!
//! A record is created by [`IdempotencyStore::claim`] in the *in progress* state, owned by the
//! random [`ClaimToken`] that the claim carried, and lives for a short *lease*. The owner then
//! either [`complete`](IdempotencyStore::complete)s it (it becomes *completed* and lives for the
//! retention period), [`release`](IdempotencyStore::release)s it (it disappears, so a retry runs
//! again) or [`extend`](IdempotencyStore::extend)s the lease while its handler is still running.
//!
//! ```text
//!               claim (absent or expired)
//!   (absent) ─────────────────────────────▶ InProgress{token, lease}
//!      ▲  ▲                                   │   │   │ extend(token): lease renewed
//!      │  └──── release(token) ───────────────┘   │   └──────────────┘
//!      │  └──── lease expires ────────────────────┤
//!      │                                          │ complete(token)
//!      └──── retention expires ─── Completed / NotReplayable
//! ```
//!
//! # The contract
//!
//! Every implementation must keep these rules; [`conformance`] (feature `conformance`) checks
//! them against a live store, and [`MemoryStore`], the Redis store and the Postgres store pass it.
//!
//! 1. **claim is atomic.** Of any number of concurrent claims of one absent key, exactly one
//!    returns [`ClaimOutcome::Claimed`]; every other returns [`ClaimOutcome::Existing`] with the
//!    record as it is. A record whose lease or retention has expired counts as absent.
//! 2. **Writes are fenced by the token.** `complete`, `release` and `extend` change the record
//!    only if it is *in progress* and holds the same token, and return `Ok(true)`; otherwise they
//!    change nothing and return `Ok(false)`. A stale owner (whose lease expired and whose key was
//!    claimed again) can never overwrite or free the newer claim, and a completed record can never
//!    be released or extended.
//! 3. **Records round-trip.** A completed record returns the status, every header (in order,
//!    repeated names included), the body bytes and the trailers exactly as given, and the
//!    fingerprint given at claim time.
//! 4. **Expiry.** An in-progress record disappears once its lease passes without an `extend`; a
//!    completed record once its retention passes. Stores measure time with their own clock;
//!    [`MemoryStore`] uses tokio's, so paused-time tests can drive it.
//! 5. **Errors are errors.** When the store cannot tell (unreachable, timed out, full), it returns
//!    a [`StoreError`]; the layer then fails closed (`503`) and never runs the handler without a
//!    claim.
//!
//! An operation may take effect when its method is called or when its future is first polled. If
//! the layer's future is dropped mid-operation, it spawns the pending future on the current tokio
//! runtime so the operation is not lost; a store must therefore tolerate its futures being moved
//! to another task.
//!
//! # Implementing a store
//!
//! The associated futures are named so the layer's response future needs no boxing when the store
//! needs none (the memory store returns [`std::future::Ready`]). A store whose client hands out
//! boxed futures can use `Pin<Box<dyn Future<Output = ...> + Send>>`.

mod error;
mod key;
mod lease;
mod memory;
mod record;

#[cfg(feature = "conformance")]
#[cfg_attr(docsrs, doc(cfg(feature = "conformance")))]
pub mod conformance;

#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis;

#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub mod postgres;

pub use self::error::StoreError;
pub use self::key::{ClaimToken, StoreKey};
pub use self::lease::Lease;
pub use self::memory::{MemoryStore, MemoryStoreBuilder};
pub use self::record::{
    ClaimOutcome, Completion, ExistingRecord, RecordState, Settled, StoredResponse,
};

use crate::fingerprint::Fingerprint;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

/// A boxed store future, for stores whose client hands out boxed futures anyway (the Redis and
/// Postgres stores): boxing once more would cost nothing.
pub type StoreFuture<T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send>>;

/// A store of idempotency records. See the [module docs](self) for the contract.
///
/// Cloning a store must be cheap and yield a handle to the same records (an `Arc` inside).
///
/// ```
/// use std::time::Duration;
/// use tower_once_idempotency::fingerprint::Fingerprint;
/// use tower_once_idempotency::store::{
///     ClaimOutcome, ClaimToken, Completion, IdempotencyStore, MemoryStore, RecordState, StoreKey,
///     StoredResponse,
/// };
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store = MemoryStore::new();
/// let key = StoreKey::from_bytes([1; 32]);
/// let fingerprint = Fingerprint::from_bytes([2; 32]);
/// let token = ClaimToken::new();
///
/// let outcome = store.claim(key, token, fingerprint, Duration::from_secs(10)).await?;
/// assert!(matches!(outcome, ClaimOutcome::Claimed));
///
/// let response = StoredResponse::new(http::StatusCode::CREATED, Default::default(), "done".into());
/// let day = Duration::from_secs(24 * 3600);
/// assert!(store.complete(key, token, Completion::Response(response), day).await?);
///
/// let again = store.claim(key, ClaimToken::new(), fingerprint, Duration::from_secs(10)).await?;
/// match again {
///     ClaimOutcome::Existing(record) => {
///         assert!(matches!(record.state, RecordState::Completed(r) if r.body == "done"));
///     }
///     ClaimOutcome::Claimed => unreachable!("the key is completed"),
/// }
/// # Ok(())
/// # }
/// ```
pub trait IdempotencyStore: Clone + Send + Sync + 'static {
    /// Whether a handler can complete its claim in its own transaction: the layers then hand
    /// each claimed request or job a [`Claim`](crate::Claim) in its extensions. `false` unless
    /// the store says otherwise ([`postgres::PostgresStore`] does).
    const COMPLETES_IN_TRANSACTION: bool = false;

    /// Future returned by [`claim`](Self::claim).
    type ClaimFuture: Future<Output = Result<ClaimOutcome, StoreError>> + Send + Unpin + 'static;
    /// Future returned by [`complete`](Self::complete).
    type CompleteFuture: Future<Output = Result<bool, StoreError>> + Send + Unpin + 'static;
    /// Future returned by [`release`](Self::release).
    type ReleaseFuture: Future<Output = Result<bool, StoreError>> + Send + Unpin + 'static;
    /// Future returned by [`extend`](Self::extend).
    type ExtendFuture: Future<Output = Result<bool, StoreError>> + Send + Unpin + 'static;

    /// Claims `key` for `token` with a lease of `lease`, or returns the record that holds it.
    fn claim(
        &self,
        key: StoreKey,
        token: ClaimToken,
        fingerprint: Fingerprint,
        lease: Duration,
    ) -> Self::ClaimFuture;

    /// Turns the in-progress record of `key` held by `token` into a completed one that lives for
    /// `retention`. `Ok(false)` if the record is not in progress under `token`.
    fn complete(
        &self,
        key: StoreKey,
        token: ClaimToken,
        completion: Completion,
        retention: Duration,
    ) -> Self::CompleteFuture;

    /// Deletes the in-progress record of `key` held by `token`. `Ok(false)` if the record is not
    /// in progress under `token`.
    fn release(&self, key: StoreKey, token: ClaimToken) -> Self::ReleaseFuture;

    /// Renews the lease of the in-progress record of `key` held by `token` to `lease` from now.
    /// `Ok(false)` if the record is not in progress under `token`.
    fn extend(&self, key: StoreKey, token: ClaimToken, lease: Duration) -> Self::ExtendFuture;

    /// Whether a claim is an open transaction rather than a written row (a
    /// [`transactional`](postgres::PostgresStore::transactional) Postgres store): nothing of an
    /// in-progress claim outlives its owner's process, so a mark that must survive a crash
    /// cannot be a claim. `false` unless the store says otherwise.
    fn claims_are_transactions(&self) -> bool {
        false
    }

    /// The writes this store finishes on tasks of its own (the Redis store sends a completion
    /// or release that failed again), so that `IdempotencyLayer::detached().wait()` at shutdown
    /// waits for them too. `None` (the default) for a store that spawns nothing.
    fn background(&self) -> Option<crate::Detached> {
        None
    }
}
