//! The record a handler writes in its own transaction: writing it there (fenced by the claim,
//! saying why when the fence refuses), and asking afterwards whether that transaction committed
//! it.

use super::{completion_statement, from_sqlx, PostgresStore};
use crate::store::Settled;
use crate::store::{ClaimToken, Completion, StoreError, StoreFuture, StoreKey};
use sqlx::{PgConnection, Row};
use std::time::Duration;

/// What a completion on the handler's connection did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CompletedOn {
    /// The record is completed, in that transaction (its top-level one's id).
    Written(Transaction),
    /// The record was already completed under this claim: by this transaction earlier, or by
    /// one that committed.
    AlreadyCompleted,
    /// The claim is no longer this request's: its lease ran out, and the key may be another's.
    Lost,
}

/// The id of the top-level transaction a handler completed its record in (Postgres's
/// `xid8`), to ask later whether it committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Transaction(i64);

impl PostgresStore {
    /// Completes the claim of `key` by `token` on `connection`, inside whatever transaction it
    /// is in, fenced like [`complete`](IdempotencyStore::complete); when the fence refuses,
    /// says why. The row stays locked until that transaction ends.
    pub(crate) async fn complete_on(
        &self,
        connection: &mut PgConnection,
        key: StoreKey,
        token: ClaimToken,
        completion: &Completion,
        retention: Duration,
    ) -> Result<CompletedOn, StoreError> {
        let query = &self.shared.queries.complete_in;
        let statement = completion_statement(query, &key, token, completion, retention);
        let written = statement
            .fetch_optional(&mut *connection)
            .await
            .map_err(from_sqlx)?;
        if let Some(row) = written {
            let transaction = row.try_get::<i64, _>(0).map_err(StoreError::corrupt)?;
            return Ok(CompletedOn::Written(Transaction(transaction)));
        }
        let row: Option<(bool, String)> = sqlx::query_as(&self.shared.queries.inspect)
            .bind(key.as_bytes().as_slice())
            .bind(*token.as_uuid())
            .fetch_optional(connection)
            .await
            .map_err(from_sqlx)?;
        Ok(match row {
            Some((true, state)) if state != "in_progress" => CompletedOn::AlreadyCompleted,
            // Ours and in progress, yet fenced out: its lease ran out. Or another's, or gone.
            _ => CompletedOn::Lost,
        })
    }

    /// What became of the record of `key` that the claim `token` completed in `transaction`,
    /// asked once the handler returned. One read-only statement.
    pub(crate) fn settled(
        &self,
        key: StoreKey,
        token: ClaimToken,
        transaction: Transaction,
    ) -> StoreFuture<Settled> {
        self.bounded(move |pool, shared| async move {
            let row: Option<(bool, String, Option<String>)> =
                sqlx::query_as(&shared.queries.settled)
                    .bind(key.as_bytes().as_slice())
                    .bind(*token.as_uuid())
                    .bind(transaction.0)
                    .fetch_optional(&pool)
                    .await?;
            Ok(match row {
                Some((true, state, xact)) if state == "in_progress" => match xact.as_deref() {
                    // The transaction committed without the record: a savepoint around it
                    // was rolled back, but the effects after it may have committed.
                    Some("committed") => Settled::Store,
                    // The record rolled back with the effects.
                    Some("aborted") => Settled::Release,
                    // Still open (handed elsewhere, or its rollback not sent yet): its own end
                    // decides.
                    Some("in progress") => Settled::Open,
                    // Too old to tell: it ended long ago, and the lease has freed the key
                    // if it never committed.
                    _ => Settled::Done,
                },
                // Completed under this claim, or no longer this claim's.
                _ => Settled::Done,
            })
        })
    }
}
