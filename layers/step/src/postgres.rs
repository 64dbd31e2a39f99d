//! A tool whose effect is in Postgres commits the step's result with it (feature `postgres`).
//!
//! On a [`PostgresStore::transactional`] store, a fresh step's claim opens a transaction that
//! holds the step's lock, and the step hands the tool a [`StepClaim`] in the request's
//! extensions (typed by the step's result). The tool takes that transaction, writes its effect
//! on it and commits with [`StepClaim::commit`]: the effect and the step's result are one
//! commit. An error, a panic or a crash
//! before it rolls both back and frees the step at once; a tool frozen past the lease has its
//! session ended by Postgres and can never commit afterwards.
//!
//! When every effect of the tool is in that transaction, nothing of a failed attempt survives,
//! so the step is safe to run again: make it
//! [`OnUnknown::RunAgain`](crate::OnUnknown::RunAgain). An effect outside it (an HTTP call the
//! tool makes before committing) is not rolled back: make the step
//! [`keyed`](crate::Step::keyed) and send the step's key with that call.
//!
//! [`StepClaim::commit`] writes the result by the layer's rules: its classifier, its codec and
//! its `result_limit`. A result the classifier does not call a success, or that cannot be kept,
//! is refused: nothing commits, the effect rolls back with the transaction, and the step is
//! not done. A step whose policy is `Refuse` (an
//! unkeyed `POST`, by default) is refused on a transactional store
//! ([`StepError::is_misused`](crate::StepError::is_misused)): its "sent" mark would be an open
//! transaction, gone with a crash. Keep such steps in a store that writes its claims (the
//! plain `PostgresStore`, Redis). On a plain `PostgresStore` the tool gets no claim: the step
//! records its result after the call, as on any store.
//!
//! ```no_run
//! use tower::BoxError;
//! use tower_once_step::postgres::StepClaim;
//!
//! #[derive(serde::Serialize, serde::Deserialize)]
//! struct Refunded { id: i64 }
//!
//! // The tool: an `http::Request` under `StepLayer::new(store.transactional())`.
//! async fn refund(req: http::Request<String>) -> Result<Refunded, BoxError> {
//!     let claim = req.extensions().get::<StepClaim<Refunded>>().cloned()
//!         .ok_or("not a step on a transactional PostgresStore")?;
//!     let mut tx = claim.transaction().await?;
//!     let (id,): (i64,) = sqlx::query_as("INSERT INTO refunds (amount) VALUES (40) RETURNING id")
//!         .fetch_one(&mut *tx)
//!         .await?;
//!     let refunded = claim.commit(tx, Refunded { id }).await?; // effect + result, one commit
//!     Ok(refunded)
//! }
//! # use tower_once_idempotency::store::postgres::sqlx;
//! ```

use std::error::Error as StdError;
use std::fmt;
use std::sync::Arc;
use tower_once_idempotency::store::postgres::{ClaimTransaction, PostgresStore};
use tower_once_idempotency::store::StoredResponse;
use tower_once_idempotency::{Claim, ClaimError};

type BoxError = Box<dyn StdError + Send + Sync>;

/// How the layer records a result: `Ok` with its record, or `Err` with why not (the value is
/// handed back either way).
pub(crate) type Recorder<T> =
    Arc<dyn Fn(T) -> Result<(T, StoredResponse), (T, String)> + Send + Sync>;

/// The claim of a step on a transactional `PostgresStore`, handed to its tool in the request's
/// extensions: its transaction, and the commit of the tool's effect with the step's result.
/// See the [module docs](self).
pub struct StepClaim<T> {
    claim: Claim<PostgresStore>,
    record: Recorder<T>,
}

impl<T> Clone for StepClaim<T> {
    fn clone(&self) -> Self {
        Self {
            claim: self.claim.clone(),
            record: Arc::clone(&self.record),
        }
    }
}

impl<T> fmt::Debug for StepClaim<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StepClaim")
            .field("claim", &self.claim)
            .finish()
    }
}

impl<T> StepClaim<T> {
    pub(crate) fn new(claim: Claim<PostgresStore>, record: Recorder<T>) -> Self {
        Self { claim, record }
    }

    /// The transaction the step's claim opened, holding the step's lock: write the effect on
    /// it (`&mut *tx` is a `&mut PgConnection`). Dropped without [`commit`](Self::commit), it
    /// rolls back and the step is free at once.
    pub async fn transaction(&self) -> Result<ClaimTransaction, ClaimError> {
        self.claim.transaction().await
    }

    /// Commits `tx` (the effect) with `value` as the step's result, by the layer's rules, in
    /// one commit, and hands `value` back. Refused, with nothing committed (the effect rolls
    /// back), when the layer's classifier does not call `Ok(value)` a success, its codec cannot
    /// keep it, or it is over the layer's `result_limit`; fails when the commit fails.
    pub async fn commit(&self, tx: ClaimTransaction, value: T) -> Result<T, BoxError> {
        let (value, stored) = (self.record)(value).map_err(|(_, why)| {
            format!("the step's result is refused by the layer's rules ({why}); nothing committed")
        })?;
        self.claim
            .commit(tx, (stored.status, stored.headers, stored.body))
            .await?;
        Ok(value)
    }
}
