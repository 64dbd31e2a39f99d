//! A tool whose effect is in Postgres commits the step's result with it (feature `postgres`).
//!
//! On a [`PostgresStore::transactional`] store, a fresh step's claim opens a transaction that
//! holds the step's lock, and the step hands its [`Claim`] to the tool in the request's
//! extensions. The tool takes that transaction, writes its effect on it and commits with
//! [`commit`]: the effect and the step's result are one commit. An error, a panic or a crash
//! before it rolls both back and frees the step at once; a tool frozen past the lease has its
//! session ended by Postgres and can never commit afterwards.
//!
//! When every effect of the tool is in that transaction, nothing of a failed attempt survives,
//! so the step is safe to run again: make it
//! [`OnUnknown::RunAgain`](crate::OnUnknown::RunAgain). An effect outside it (an HTTP call the
//! tool makes before committing) is not rolled back: make the step
//! [`keyed`](crate::Step::keyed) and send the step's key with that call.
//!
//! What [`commit`] writes is the step's result: the layer's classifier and `result_limit` do
//! not look at it (the tool decided by committing). Commit a success only; to refuse, return an
//! error and let the transaction drop. A step whose policy is `Refuse` (an
//! unkeyed `POST`, by default) is refused on a transactional store
//! ([`StepError::is_misused`](crate::StepError::is_misused)): its "sent" mark would be an open
//! transaction, gone with a crash. Keep such steps in a store that writes its claims (the
//! plain `PostgresStore`, Redis). On a plain `PostgresStore` the tool gets no claim: the step
//! records its result after the call, as on any store.
//!
//! ```no_run
//! use tower_once_idempotency::store::postgres::PostgresStore;
//! use tower_once_idempotency::Claim;
//! use tower::BoxError;
//!
//! #[derive(serde::Serialize, serde::Deserialize)]
//! struct Refunded { id: i64 }
//!
//! // The tool: an `http::Request` under `StepLayer::new(store.transactional())`.
//! async fn refund(req: http::Request<String>) -> Result<Refunded, BoxError> {
//!     let claim = req.extensions().get::<Claim<PostgresStore>>().cloned()
//!         .ok_or("not a step on a transactional PostgresStore")?;
//!     let mut tx = claim.transaction().await?;
//!     let (id,): (i64,) = sqlx::query_as("INSERT INTO refunds (amount) VALUES (40) RETURNING id")
//!         .fetch_one(&mut *tx)
//!         .await?;
//!     let refunded = Refunded { id };
//!     tower_once_step::postgres::commit(&claim, tx, &refunded).await?; // effect + result
//!     Ok(refunded)
//! }
//! # use tower_once_idempotency::store::postgres::sqlx;
//! ```

use crate::codec::{Codec, Json};
use crate::record;
use std::error::Error as StdError;
use tower_once_idempotency::store::postgres::{ClaimTransaction, PostgresStore};
use tower_once_idempotency::Claim;

type BoxError = Box<dyn StdError + Send + Sync>;

/// Commits `tx` (the tool's effect) with `value` as the step's result, encoded as JSON (the
/// layer's default codec): one commit. Fails, and nothing is committed, when the value does not
/// encode or the commit fails ([`ClaimError`](tower_once_idempotency::ClaimError)).
pub async fn commit<T: serde::Serialize + serde::de::DeserializeOwned>(
    claim: &Claim<PostgresStore>,
    tx: ClaimTransaction,
    value: &T,
) -> Result<(), BoxError> {
    commit_with(claim, tx, &Json, value).await
}

/// [`commit`] with the layer's own codec.
pub async fn commit_with<T, C: Codec<T>>(
    claim: &Claim<PostgresStore>,
    tx: ClaimTransaction,
    codec: &C,
    value: &T,
) -> Result<(), BoxError> {
    let stored = record::done(codec.encode(value)?);
    claim
        .commit(tx, (stored.status, stored.headers, stored.body))
        .await?;
    Ok(())
}
