//! The claim a request or job holds while its handler runs, handed to the handler so that it
//! can record its outcome in its own database transaction, together with its effects.

mod error;
mod extract;
#[cfg(feature = "postgres")]
mod postgres_respond_in;
#[cfg(feature = "postgres")]
mod postgres_transaction;

pub use self::error::ClaimError;
pub(crate) use self::error::Refused;

use crate::config::StoreRules;
use crate::store::{ClaimToken, Settled, StoreFuture, StoreKey};
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// The claim this request (or job) holds on its idempotency key: its store, key and token.
///
/// With a store whose records live in the handler's own database
/// ([`PostgresStore`](crate::store::postgres::PostgresStore), feature `postgres`),
/// `IdempotencyLayer` puts one in the extensions of every request it claimed, and the worker's
/// `RunOnceLayer` in those of every job it claimed. The handler then records its outcome in the
/// transaction that writes its effects: both commit, or neither does.
///
/// - On a [`transactional`](crate::store::postgres::PostgresStore::transactional) store the
///   claim opened the handler's transaction, holding the key's lock: `claim.transaction().await`
///   hands it over, and `claim.commit(tx, response).await` (jobs: `claim.commit(tx, ())`)
///   writes the record and commits, one commit for claim, effects and record. The rest of this
///   list is the default two-step claim.
/// - HTTP: `claim.respond_in(&mut tx, response)` stores the response the handler returns, and
///   returns it; once the handler returns, the layer reads the record and writes nothing more
///   if it committed (it stores the response itself if the transaction committed without
///   the record, and releases the key if the transaction rolled back).
/// - Jobs: `claim.complete_in(&mut tx)` records the job as done.
///
/// Both are fenced: they change the record only while the claim is still this request's (in
/// progress, same token, lease not run out), and fail with [`ClaimError::is_lost`] otherwise
/// (or [`ClaimError::is_already_completed`] when this claim already completed it: a handler
/// completes its claim once).
/// The handler must then not commit (with `?` the transaction is dropped and rolled back), so a
/// stale owner, whose lease ran out while it was paused and whose key another request took,
/// can never commit a second effect. From the completion to the commit the record's row is
/// locked and reads as in progress: a duplicate arriving then is answered `409`, and its retry
/// after the commit replays the stored response.
///
/// In axum, take it as an extractor: `Claim<PostgresStore>`, or `Option<Claim<PostgresStore>>`
/// for routes where the key is optional. Elsewhere read it from the request's extensions.
#[derive(Clone)]
pub struct Claim<St> {
    store: St,
    key: StoreKey,
    token: ClaimToken,
    retention: Duration,
    // The layer's rules for stored responses (its predicate, deny-listed headers, size limit);
    // `None` for a job's claim. Read by the stores that complete in transaction (feature
    // `postgres`).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    rules: Option<Arc<dyn StoreRules>>,
    // A job's claim: where the handler leaves the check of the record it wrote itself, read by
    // `RunOnceLayer`. A request's claim has none (the layer reads the record itself).
    completed: Option<JobRecord>,
}

impl<St> fmt::Debug for Claim<St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Claim")
            .field("key", &self.key)
            .field("token", &self.token)
            .field("retention", &self.retention)
            .finish_non_exhaustive()
    }
}

impl<St> Claim<St> {
    /// The claim of a request, stored by the layer's rules.
    pub(crate) fn for_request(
        store: St,
        key: StoreKey,
        token: ClaimToken,
        retention: Duration,
        rules: Arc<dyn StoreRules>,
    ) -> Self {
        Self {
            store,
            key,
            token,
            retention,
            rules: Some(rules),
            completed: None,
        }
    }

    /// The claim of a job (for `RunOnceLayer`): `record` holds, once the handler recorded the
    /// job as done itself, how to check that record committed.
    #[doc(hidden)]
    pub fn for_job(
        store: St,
        key: StoreKey,
        token: ClaimToken,
        retention: Duration,
        record: JobRecord,
    ) -> Self {
        Self {
            store,
            key,
            token,
            retention,
            rules: None,
            completed: Some(record),
        }
    }

    /// The store the claim is in.
    pub fn store(&self) -> &St {
        &self.store
    }

    /// The record's key in the store.
    pub fn key(&self) -> StoreKey {
        self.key
    }

    /// The claim's token: the record is this request's while it holds it.
    pub fn token(&self) -> ClaimToken {
        self.token
    }

    /// How long the completed record is kept.
    pub fn retention(&self) -> Duration {
        self.retention
    }

    /// Whether the handler already completed this job's record itself (`complete_in`); always
    /// `false` for a request's claim, whose record the layer reads instead.
    pub fn is_completed(&self) -> bool {
        self.completed.as_ref().is_some_and(JobRecord::is_written)
    }

    /// Leaves the check of the job's record, written in the handler's own transaction.
    #[cfg(feature = "postgres")]
    pub(crate) fn written_in(&self, check: Check) {
        if let Some(record) = &self.completed {
            record.set(check);
        }
    }

    /// The rules a response is stored by: the layer's, or its defaults for a job's claim.
    #[cfg(feature = "postgres")]
    pub(crate) fn rules(&self) -> &dyn StoreRules {
        match &self.rules {
            Some(rules) => rules.as_ref(),
            None => &crate::config::DefaultRules,
        }
    }
}

/// Put on a response whose record the handler wrote in its own transaction (under `token`).
/// The mark says only that it was written, not that it committed: once the handler has
/// returned, the layer runs `check` and writes nothing more only if the record is settled.
#[derive(Clone)]
pub(crate) struct StoredBy {
    pub(crate) token: ClaimToken,
    pub(crate) check: Check,
}

impl fmt::Debug for StoredBy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoredBy")
            .field("token", &self.token)
            .finish_non_exhaustive()
    }
}

/// The read that says what became of a record a handler wrote in its own transaction.
pub(crate) type Check = Arc<dyn Fn() -> StoreFuture<Settled> + Send + Sync>;

/// Where a job's handler leaves the check of the record it wrote in its own transaction
/// (`Claim::complete_in`), for the worker's `RunOnceLayer` to read once the handler returned.
/// The layers' plumbing: not part of the stable API.
#[doc(hidden)]
#[derive(Clone, Default)]
pub struct JobRecord(Arc<Mutex<Option<Check>>>);

impl JobRecord {
    /// Whether the handler wrote the record (in a transaction that may not have committed it).
    pub fn is_written(&self) -> bool {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some()
    }

    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn set(&self, check: Check) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(check);
    }

    /// The read that says whether the record committed, if the handler wrote it.
    pub fn check(&self) -> Option<StoreFuture<Settled>> {
        let check = self
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        check.map(|check| check())
    }
}

impl fmt::Debug for JobRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JobRecord")
            .field("written", &self.is_written())
            .finish()
    }
}
