//! Run a job's effect once per job id, on any [`IdempotencyStore`].
//!
//! Streams deliver at least once: a worker that dies after the effect but before `XACK` has its
//! entry redelivered, and a producer retried by its caller enqueues the same job id twice.
//! [`RunOnceLayer`] claims the job id in the store before the handler runs:
//!
//! | the store has the job id | the layer | the worker then |
//! |---|---|---|
//! | nothing (or an expired claim) | claims it, runs the handler; `Ok` → records it done, `Err` → releases the claim | acts on the handler's outcome |
//! | done | returns [`RunOnceOutcome::Duplicate`], the handler does not run | `XACK` |
//! | in progress (another delivery is running it) | returns an error that [`is_in_progress`](RunOnceError::is_in_progress) | leaves it pending (transient) |
//! | store unreachable | returns an error that [`is_store`](RunOnceError::is_store) | leaves it pending (transient) |
//!
//! While the handler runs, the claim's lease is renewed every third of it, so a slow handler
//! keeps it and a dead worker's claim expires within one lease. A run dropped while its handler
//! runs (a panic, a cancelled deadline or shutdown) releases its claim at once, on a task of
//! its own (fenced by the claim: a record that committed stays). The record is kept for the
//! retention period (default 24 h): a duplicate arriving later runs again.
//!
//! # Run-once in the job's transaction
//!
//! On most stores the effect and the "done" record are two writes: a worker that dies between
//! them leaves the claim in progress, and once its lease expires the job runs again. On a store
//! whose records live in the handler's database (the Postgres store of
//! `tower-once-idempotency`, feature `postgres`), the layer puts a
//! [`Claim`](tower_once_idempotency::Claim) in the job's extensions, and the handler records
//! the job as done in the transaction that writes its effects (and its outbox rows). Once the
//! handler returns `Ok`, the layer reads the record (one read-only statement): committed with
//! the effects, it records nothing more; rolled back with a savepoint while the effects
//! committed, it records the job itself; rolled back with the whole transaction, the delivery
//! is an error (left pending, the claim released at once) so the job runs again. The
//! completion is fenced by the claim's token: a worker that
//! stalled past its lease (SIGSTOP, a frozen Redis, a long pause) and whose job another worker
//! took over finds its claim lost ([`ClaimError::is_lost`](tower_once_idempotency::ClaimError::is_lost))
//! and must not commit, so the effect commits once.
//!
//! ```no_run
//! use tower_once_idempotency::store::postgres::PostgresStore;
//! use tower_once_idempotency::Claim;
//! use tower_once_worker::{Job, JobError};
//!
//! async fn handle(job: Job) -> Result<(), JobError> {
//!     let claim = job.extensions().get::<Claim<PostgresStore>>().cloned()
//!         .ok_or_else(|| JobError::permanent("not under RunOnceLayer on Postgres"))?;
//!     let mut tx = claim.store().pool().begin().await.map_err(JobError::transient)?;
//!     claim.complete_in(&mut tx).await.map_err(JobError::transient)?; // fenced: first
//!     // ... the job's effects and outbox rows, on &mut *tx ...
//!     tx.commit().await.map_err(JobError::transient)?;
//!     Ok(())
//! }
//! ```
//!
//! On a transactional store (`PostgresStore::transactional()`) the claim itself opens the job's transaction, holding the job id's lock: take it with
//! `claim.transaction().await`, write the effects on it, and `claim.commit(tx, ()).await`
//! records the job as done in the same commit. A failure, a panic or a crash before that commit
//! frees the job id at once (no lease to wait out), and a handler that returns `Ok` without
//! having committed it (dropped, or still held by a task it was handed to) is an error, so the
//! job runs again.
//!
//! What remains: effects outside that database (an email, another API) are not in the
//! transaction; write them as outbox rows in it, and let the relay send them.

mod error;
mod future;
mod identity;
mod outcome;

pub use self::error::RunOnceError;
pub use self::future::ResponseFuture;
pub use self::identity::job_store_key;
pub use self::outcome::RunOnceOutcome;

use self::identity::entry_fingerprint;
use crate::job::Job;
use std::task::{Context, Poll};
use std::time::Duration;
use tower_layer::Layer;
use tower_once_idempotency::store::{ClaimToken, IdempotencyStore};
use tower_service::Service;

/// Default lease of a run-once claim.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// Default retention of a "done" record.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(24 * 3600);

/// Wraps a handler so each job id's effect runs once. See the [module docs](self).
///
/// ```
/// use tower::{Layer, ServiceExt};
/// use tower_once_idempotency::store::MemoryStore;
/// use tower_once_worker::{Job, JobError, JobId, RunOnceLayer};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let layer = RunOnceLayer::new(MemoryStore::new());
/// let handler = tower::service_fn(|_job: Job| async { Ok::<_, JobError>("sent") });
/// let job = Job::new("1-0", JobId::new("welcome-mail-7").unwrap(), "{}", 1);
/// let first = layer.layer(handler).oneshot(job.clone()).await.unwrap();
/// assert!(!first.is_duplicate());
/// let again = layer.layer(handler).oneshot(job).await.unwrap();
/// assert!(again.is_duplicate()); // the handler did not run
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct RunOnceLayer<St> {
    store: St,
    lease: Duration,
    retention: Duration,
}

impl<St> RunOnceLayer<St> {
    /// Run-once on `store`, with a 30 s lease and 24 h retention.
    pub const fn new(store: St) -> Self {
        Self {
            store,
            lease: DEFAULT_LEASE,
            retention: DEFAULT_RETENTION,
        }
    }

    /// How long a claim lives without renewal; renewed every third of it while the handler
    /// runs. A delivery arriving while a dead worker's claim is unexpired is left pending
    /// (and counts as a delivery). Under a [`Worker`](crate::Worker), use at most half its
    /// `claim_idle`: the crashed delivery's claim has then always expired by the time its
    /// entry is taken over.
    ///
    /// # Panics
    ///
    /// If `lease` is under 3 ms.
    pub fn lease(mut self, lease: Duration) -> Self {
        assert!(
            lease >= Duration::from_millis(3),
            "RunOnceLayer::lease must be at least 3 ms"
        );
        self.lease = lease;
        self
    }

    /// How long a "done" record is kept (duplicates within it are acknowledged unrun).
    ///
    /// # Panics
    ///
    /// If `retention` is zero.
    pub fn retention(mut self, retention: Duration) -> Self {
        assert!(
            !retention.is_zero(),
            "RunOnceLayer::retention must not be zero"
        );
        self.retention = retention;
        self
    }
}

impl<S, St: Clone> Layer<S> for RunOnceLayer<St> {
    type Service = RunOnce<S, St>;

    fn layer(&self, inner: S) -> Self::Service {
        RunOnce {
            inner,
            store: self.store.clone(),
            lease: self.lease,
            retention: self.retention,
        }
    }
}

/// The service of [`RunOnceLayer`].
#[derive(Debug, Clone)]
pub struct RunOnce<S, St> {
    inner: S,
    store: St,
    lease: Duration,
    retention: Duration,
}

impl<S, St> RunOnce<S, St> {
    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, consuming this one.
    pub fn into_inner(self) -> S {
        self.inner
    }

    /// The store of the run-once records.
    pub fn store_ref(&self) -> &St {
        &self.store
    }
}

impl<S, St> Service<Job> for RunOnce<S, St>
where
    S: Service<Job> + Clone,
    St: IdempotencyStore,
{
    type Response = RunOnceOutcome<S::Response>;
    type Error = RunOnceError<S::Error>;
    type Future = ResponseFuture<S, St>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(RunOnceError::inner)
    }

    fn call(&mut self, job: Job) -> Self::Future {
        // The ready service goes into the future; the clone stays for the next poll_ready.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let key = job_store_key(job.job_id());
        let token = ClaimToken::new();
        // NOTE: the record's fingerprint names the stream entry that claimed it, so that a
        // second delivery can tell another entry with the same job id (a duplicate enqueue:
        // acknowledged as a duplicate, the running entry stays pending until it is done) from
        // the same entry delivered again while it runs (left pending: acknowledging it could
        // lose the job if the running delivery then fails).
        let entry = entry_fingerprint(job.stream_id());
        let claim = self.store.claim(key, token, entry, self.lease);
        ResponseFuture::new(
            self.store.clone(),
            (key, token),
            (self.lease, self.retention),
            claim,
            (inner, job),
        )
    }
}
