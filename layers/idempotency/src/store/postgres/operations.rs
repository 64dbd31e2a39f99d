//! The store's four operations on its pool, one statement each, and the completion statement
//! the transactional paths share.

use super::row::{decode_claim, header_columns};
use super::PostgresStore;
use crate::fingerprint::Fingerprint;
use crate::store::{ClaimOutcome, ClaimToken, Completion, IdempotencyStore, StoreFuture, StoreKey};
use sqlx::postgres::PgArguments;
use sqlx::Postgres;
use std::time::Duration;

/// A fenced completion statement (`complete` or `complete_in`), with its arguments bound.
pub(crate) fn completion_statement<'q>(
    query: &'q str,
    key: &'q StoreKey,
    token: ClaimToken,
    completion: &'q Completion,
    retention: Duration,
) -> sqlx::query::Query<'q, Postgres, PgArguments> {
    let query = sqlx::query(query)
        .bind(key.as_bytes().as_slice())
        .bind(*token.as_uuid());
    match completion {
        Completion::Response(response) => {
            let (names, values) = header_columns(&response.headers);
            let (trailer_names, trailer_values) = match &response.trailers {
                Some(trailers) => {
                    let (names, values) = header_columns(trailers);
                    (Some(names), Some(values))
                }
                None => (None, None),
            };
            query
                .bind("completed")
                .bind(millis(retention))
                .bind(i16::try_from(response.status.as_u16()).unwrap_or(i16::MAX))
                .bind(names)
                .bind(values)
                .bind(response.body.as_ref())
                .bind(trailer_names)
                .bind(trailer_values)
        }
        Completion::NotReplayable => query
            .bind("not_replayable")
            .bind(millis(retention))
            .bind(None::<i16>)
            .bind(None::<Vec<&str>>)
            .bind(None::<Vec<&[u8]>>)
            .bind(None::<&[u8]>)
            .bind(None::<Vec<&str>>)
            .bind(None::<Vec<&[u8]>>),
    }
}

impl IdempotencyStore for PostgresStore {
    const COMPLETES_IN_TRANSACTION: bool = true;

    fn claims_are_transactions(&self) -> bool {
        self.is_transactional()
    }

    type ClaimFuture = StoreFuture<ClaimOutcome>;
    type CompleteFuture = StoreFuture<bool>;
    type ReleaseFuture = StoreFuture<bool>;
    type ExtendFuture = StoreFuture<bool>;

    fn claim(
        &self,
        key: StoreKey,
        token: ClaimToken,
        fingerprint: Fingerprint,
        lease: Duration,
    ) -> Self::ClaimFuture {
        if self.shared.transactional {
            let store = self.clone();
            return self
                .bounded(move |_, _| store.claim_in_transaction(key, token, fingerprint, lease));
        }
        self.bounded(move |pool, shared| async move {
            let row = sqlx::query(&shared.queries.claim)
                .bind(key.as_bytes().as_slice())
                .bind(*token.as_uuid())
                .bind(fingerprint.as_bytes().as_slice())
                .bind(millis(lease))
                .bind(millis(shared.timeout))
                .fetch_one(&pool)
                .await?;
            decode_claim(&row).map_err(|e| sqlx::Error::Decode(Box::new(e)))
        })
    }

    fn complete(
        &self,
        key: StoreKey,
        token: ClaimToken,
        completion: Completion,
        retention: Duration,
    ) -> Self::CompleteFuture {
        if self.shared.transactional {
            let store = self.clone();
            return self.bounded(move |_, _| {
                store.complete_in_transaction(key, token, completion, retention)
            });
        }
        self.bounded(move |pool, shared| async move {
            let query = &shared.queries.complete;
            let statement = completion_statement(query, &key, token, &completion, retention);
            Ok(statement.execute(&pool).await?.rows_affected() == 1)
        })
    }

    fn release(&self, key: StoreKey, token: ClaimToken) -> Self::ReleaseFuture {
        if self.shared.transactional {
            let store = self.clone();
            return self.bounded(move |_, _| async move {
                Ok(store.release_in_transaction(key, token).await)
            });
        }
        self.bounded(move |pool, shared| async move {
            let done = sqlx::query(&shared.queries.release)
                .bind(key.as_bytes().as_slice())
                .bind(*token.as_uuid())
                .execute(&pool)
                .await?;
            Ok(done.rows_affected() == 1)
        })
    }

    fn extend(&self, key: StoreKey, token: ClaimToken, lease: Duration) -> Self::ExtendFuture {
        if self.shared.transactional {
            let store = self.clone();
            return self.bounded(move |_, _| store.extend_in_transaction(key, token, lease));
        }
        self.bounded(move |pool, shared| async move {
            sqlx::query_scalar::<_, bool>(&shared.queries.extend)
                .bind(key.as_bytes().as_slice())
                .bind(*token.as_uuid())
                .bind(millis(lease))
                .bind(millis(shared.timeout))
                .fetch_one(&pool)
                .await
        })
    }
}

/// Milliseconds, at least 1 and at most about 100 years (the layer's longest duration).
pub(crate) fn millis(duration: Duration) -> i64 {
    let capped = duration.min(crate::config::MAX_DURATION);
    i64::try_from(capped.as_millis()).unwrap_or(i64::MAX).max(1)
}
