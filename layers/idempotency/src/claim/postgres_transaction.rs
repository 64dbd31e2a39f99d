//! The transaction a transactional claim opened, handed to the handler and committed with the
//! record ([`PostgresStore::transactional`]).

use super::postgres_respond_in::Prepared;
use super::{Claim, ClaimError};
use crate::store::postgres::{sqlx_error as from_sqlx, ClaimTransaction, PostgresStore};
use axum::response::{IntoResponse, Response};
use std::sync::Arc;

impl Claim<PostgresStore> {
    /// Takes the transaction this claim opened (on a
    /// [`transactional`](PostgresStore::transactional) store): it holds the key's lock, so no
    /// duplicate runs while it is open. Write the effects on it, then finish with
    /// [`commit`](Self::commit). Dropping it rolls it back and frees the key at once. Until
    /// it is taken the layer keeps it alive (a renewal may have it out for one statement: this
    /// waits for it); once taken, it may stay idle at most the layer's lease between its
    /// statements before Postgres ends it (then `commit` fails and nothing is stored).
    ///
    /// Fails with [`ClaimError::is_misused`] when the store is not transactional, or the
    /// transaction was already taken.
    pub async fn transaction(&self) -> Result<ClaimTransaction, ClaimError> {
        if !self.store().is_transactional() {
            return Err(ClaimError::misused(
                "Claim::transaction needs a transactional store (PostgresStore::transactional)",
            ));
        }
        let tx = self
            .store()
            .take_transaction(self.token())
            .await
            .ok_or_else(|| {
                ClaimError::misused("the claim's transaction was already taken, or is gone")
            })?;
        // A job's `RunOnceLayer` asks, once the handler returned, whether it committed.
        let store = self.store().clone();
        let token = self.token();
        self.written_in(Arc::new(move || {
            let settled = store.transaction_settled(token);
            Box::pin(std::future::ready(Ok(settled)))
        }));
        Ok(tx)
    }

    /// Writes `response` as the key's record in `tx` and commits: the effects, the claim and
    /// the record in one commit. Returns the response for the handler to return (the stored
    /// one, by construction). For a job's claim, pass `()`: the job is recorded as done.
    ///
    /// The response is stored by the layer's rules, as the layer would store it: one its
    /// [`store_when`](crate::IdempotencyLayer::store_when) predicate refuses (a `503`, a
    /// validation `422`, a gRPC failure in the trailers) commits the effects with no record,
    /// and the key is free at once for the retry; commit with such an answer only what may
    /// happen again: to refuse a request after writing on `tx`, return an error instead and let
    /// `tx` drop, which rolls the writes back. A body over the response limit is recorded as
    /// not replayable.
    ///
    /// Fails, and nothing committed, with [`ClaimError::is_store`] when a statement or the
    /// commit failed (a serialization failure at `SERIALIZABLE` included: the retry runs the
    /// handler again), [`ClaimError::is_lost`] when a live record of another claim holds the
    /// key (written by a store that is not transactional on the same table), and
    /// [`ClaimError::is_misused`] when `tx` is another claim's. A commit whose answer was lost
    /// (the connection dropped during `COMMIT`) may have committed: the retry then replays.
    ///
    /// ```no_run
    /// use axum::{http::StatusCode, response::Response, Json};
    /// use tower_once_idempotency::store::postgres::{sqlx, PostgresStore};
    /// use tower_once_idempotency::{Claim, ClaimError};
    ///
    /// async fn charge(claim: Claim<PostgresStore>, Json(amount): Json<i64>) -> Result<Response, ClaimError> {
    ///     let mut tx = claim.transaction().await?;
    ///     let id: i64 = sqlx::query_scalar("INSERT INTO charges (amount) VALUES ($1) RETURNING id")
    ///         .bind(amount)
    ///         .fetch_one(&mut *tx)
    ///         .await?;
    ///     claim.commit(tx, (StatusCode::CREATED, Json(id))).await
    /// }
    /// ```
    pub async fn commit<R: IntoResponse>(
        &self,
        tx: ClaimTransaction,
        response: R,
    ) -> Result<Response, ClaimError> {
        if tx.token() != self.token() {
            return Err(ClaimError::misused("the transaction is another claim's"));
        }
        let Prepared {
            parts,
            body,
            completion,
        } = self.prepare(response).await?;
        match completion {
            None => tx.commit().await.map_err(sqlx_error)?,
            Some(completion) => {
                let recorded = tx
                    .record_and_commit(self.store(), &completion, self.retention())
                    .await
                    .map_err(sqlx_error)?;
                if !recorded {
                    return Err(ClaimError::lost());
                }
            }
        }
        Ok(Response::from_parts(parts, body))
    }
}

fn sqlx_error(error: sqlx::Error) -> ClaimError {
    ClaimError::store(from_sqlx(error))
}

/// A failed statement in a handler holding a claim: `?` turns it into a [`ClaimError`]
/// ([`is_store`](ClaimError::is_store), `503`, never stored as the key's answer).
impl From<sqlx::Error> for ClaimError {
    fn from(error: sqlx::Error) -> Self {
        sqlx_error(error)
    }
}
