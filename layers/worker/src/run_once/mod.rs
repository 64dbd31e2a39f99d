//! Run a job's effect once per job id, on any
//! [`IdempotencyStore`](tower_once_idempotency::store::IdempotencyStore).
//!
//! Streams deliver at least once: a worker that dies after the effect but before `XACK` has its
//! entry redelivered, and a producer retried by its caller enqueues the same job id twice.
//! [`RunOnceLayer`] claims the job id in the store before the handler runs. It is
//! `tower-once-step`'s [`tower_once_step::run_once::RunOnceLayer`], the step
//! mechanism with a job's identity: a [`Job`](crate::Job) is a
//! [`Delivery`](tower_once_step::run_once::Delivery) whose key is its job id's
//! ([`job_store_key`]) and whose delivery is its stream entry.
//!
//! | the store has the job id | the layer | the worker then |
//! |---|---|---|
//! | nothing (or an expired claim) | claims it, runs the handler; `Ok` → records it done, `Err` → releases the claim | acts on the handler's outcome |
//! | done | returns [`RunOnceOutcome::Duplicate`], the handler does not run | `XACK` |
//! | in progress by another stream entry with the same job id (a duplicate enqueue) | returns [`RunOnceOutcome::Duplicate`]: the running entry stays pending until it is done, or is delivered again if it fails | `XACK` |
//! | in progress by this very entry (taken over while it still runs) | returns an error that [`is_in_progress`](RunOnceError::is_in_progress), not waited for | leaves it pending (transient) |
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
//! is an error (left pending, the claim released at once) so the job runs again. A
//! transaction the handler left open (handed to a task, dropped without a commit: its
//! rollback is sent later) is read again until it ends, for up to a third of the lease; a job
//! whose record is still not known then (or whose read fails) is left pending with its claim
//! held, never acknowledged, and its record decides the next delivery. The
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

mod identity;

pub use self::identity::job_store_key;
pub use tower_once_step::run_once::{
    ResponseFuture, RunOnce, RunOnceError, RunOnceLayer, RunOnceOutcome, DEFAULT_LEASE,
    DEFAULT_RETENTION,
};
