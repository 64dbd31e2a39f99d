//! Completing a [`Claim`] on the handler's own connection, inside its transaction.

use super::{Claim, ClaimError, StoredBy};
use crate::headers::storable_headers;
use crate::store::postgres::{CompletedOn, PostgresStore, Transaction};
use crate::store::{Completion, StoredResponse};
use axum::body::Body;
use axum::response::{IntoResponse, Response};
use sqlx::PgConnection;
use std::future::poll_fn;
use std::ops::DerefMut;
use std::sync::Arc;
use tower_once_core::body::{BufferedBody, Collected, Collector};

/// A handler's response, prepared for storing by the layer's rules.
pub(super) struct Prepared {
    pub(super) parts: http::response::Parts,
    pub(super) body: Body,
    /// `None`: the layer's rules do not store this response.
    pub(super) completion: Option<Completion>,
}

impl Claim<PostgresStore> {
    /// Stores `response` as this request's record on `connection` (your transaction: a
    /// `sqlx::Transaction`, or any connection; pass `&mut tx`), fenced
    /// by the claim, and returns it for the handler to return: the stored response is by
    /// construction the one the client gets, replays included. Commit after this, then return
    /// the response.
    ///
    /// Once the handler has returned, the layer reads the record (one read-only statement) and
    /// acts on what it finds, not on what the handler returned:
    ///
    /// | the record | the layer |
    /// |---|---|
    /// | completed under this claim (the transaction committed) | writes nothing more |
    /// | in progress, and the transaction that wrote it committed (it was written in a savepoint that was rolled back) | stores the returned response itself, by its rules: the effects that committed are answered once |
    /// | in progress, and that transaction rolled back | releases the key at once: the retry runs the handler |
    /// | in progress, and that transaction still open (handed elsewhere, or dropped and its rollback not sent yet) | writes nothing: if it never commits, the key is free once the lease ends |
    /// | another claim's, or gone | writes nothing |
    ///
    /// The response is stored by the layer's rules, exactly as the layer would store it:
    ///
    /// - Only a response the layer's [`store_when`](crate::IdempotencyLayer::store_when)
    ///   predicate stores (by default every 2xx, 3xx and 4xx but 400, 408, 413, 415, 422, 425
    ///   and 429) is written. Any other (a `503`, a validation `422`, a status a replaced
    ///   predicate refuses, a gRPC failure in the trailers) is returned as it is, and nothing
    ///   is written: once the handler returns it, the layer releases the key, so the client's
    ///   retry (or its fixed resend) runs the handler again. Such an answer says "try again":
    ///   commit with it only what may happen again.
    /// - Hop-by-hop and deny-listed headers are left out, and a body over the layer's response
    ///   limit is not kept (later duplicates get the layer's "not replayable" answer, and never
    ///   run the handler).
    ///
    /// From the write to the commit the record's row is locked and still reads as in progress:
    /// a duplicate is answered `409`, and its retry after the commit replays.
    ///
    /// Use it in a `READ COMMITTED` transaction (Postgres's default): at `REPEATABLE READ` or
    /// above, a lease renewal committed after the transaction's snapshot (a handler slower
    /// than a third of the lease) makes the completion fail with a serialization error
    /// ([`ClaimError::is_store`], its cause SQLSTATE `40001`): nothing commits, the layer
    /// releases the key, and the client's retry runs the handler again. The
    /// statements run on your connection, so your transaction's own `statement_timeout` bounds
    /// them, not the store's.
    ///
    /// Fails, and then the transaction must not commit (return the error: with `?` the
    /// transaction is dropped and rolls back), with:
    /// - [`ClaimError::is_lost`] when the claim is no longer this request's (its lease ran
    ///   out and a retry may have taken the key);
    /// - [`ClaimError::is_already_completed`] when this claim's record is already completed:
    ///   a handler completes its claim once (`respond_in` or `complete_in`), and a second
    ///   completion is refused, in the same transaction or after the first committed;
    /// - [`ClaimError::is_store`] when a statement failed (a serialization failure included);
    /// - [`ClaimError::is_body`] when the response's body failed while it was read.
    ///
    /// The error's response (its `IntoResponse`) is never stored as the key's answer,
    /// whatever the layer's predicate: the layer releases the claim instead.
    ///
    /// ```no_run
    /// use axum::{http::StatusCode, response::Response, Json};
    /// use tower_once_idempotency::store::postgres::{sqlx, PostgresStore};
    /// use tower_once_idempotency::Claim;
    ///
    /// async fn charge(
    ///     claim: Claim<PostgresStore>,
    ///     Json(amount): Json<i64>,
    /// ) -> Result<Response, Response> {
    ///     let fail = |e: sqlx::Error| (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response();
    ///     # use axum::response::IntoResponse;
    ///     let mut tx = claim.store().pool().begin().await.map_err(fail)?;
    ///     let id: i64 = sqlx::query_scalar("INSERT INTO charges (amount) VALUES ($1) RETURNING id")
    ///         .bind(amount)
    ///         .fetch_one(&mut *tx)
    ///         .await
    ///         .map_err(fail)?;
    ///     let response = claim
    ///         .respond_in(&mut tx, (StatusCode::CREATED, Json(id)))
    ///         .await
    ///         .map_err(IntoResponse::into_response)?;
    ///     tx.commit().await.map_err(fail)?;
    ///     Ok(response)
    /// }
    /// ```
    pub async fn respond_in<C, R>(
        &self,
        connection: &mut C,
        response: R,
    ) -> Result<Response, ClaimError>
    where
        C: DerefMut<Target = PgConnection> + Send,
        R: IntoResponse,
    {
        if self.store().is_transactional() {
            return Err(ClaimError::misused(
                "this store opens the handler's transaction: take it with Claim::transaction \
                 and finish it with Claim::commit",
            ));
        }
        let Prepared {
            mut parts,
            body,
            completion,
        } = self.prepare(response).await?;
        let Some(completion) = completion else {
            // NOTE: the layer releases the key for this response by the same rules once the
            // handler returns it, since it carries no mark of a stored record.
            return Ok(Response::from_parts(parts, body));
        };
        let transaction = self.record_on(connection, &completion).await?;
        let (store, key, token) = (self.store().clone(), self.key(), self.token());
        parts.extensions.insert(StoredBy {
            token,
            check: Arc::new(move || store.settled(key, token, transaction)),
        });
        Ok(Response::from_parts(parts, body))
    }

    /// Records this job as done on `connection` (your transaction), fenced by the claim: for
    /// the worker's `RunOnceLayer`, which reads the record once the handler returns `Ok` and
    /// records nothing more when your commit included it. Commit after this. Fails with [`ClaimError::is_lost`] when the claim is no longer
    /// this delivery's (a worker paused past its lease, whose job another worker took), with
    /// [`ClaimError::is_already_completed`] when the record is already done under this claim
    /// (a second completion), and with [`ClaimError::is_store`] when a statement failed (at
    /// `REPEATABLE READ` or above, a lease renewal after the snapshot is a serialization
    /// failure): do not commit then, so the effect happens once.
    pub async fn complete_in<C>(&self, connection: &mut C) -> Result<(), ClaimError>
    where
        C: DerefMut<Target = PgConnection> + Send,
    {
        if self.store().is_transactional() {
            return Err(ClaimError::misused(
                "this store opens the handler's transaction: take it with Claim::transaction \
                 and finish it with Claim::commit",
            ));
        }
        let done = StoredResponse::new(
            http::StatusCode::OK,
            http::HeaderMap::new(),
            bytes::Bytes::new(),
        );
        let transaction = self
            .record_on(connection, &Completion::Response(done))
            .await?;
        let (store, key, token) = (self.store().clone(), self.key(), self.token());
        self.written_in(Arc::new(move || store.settled(key, token, transaction)));
        Ok(())
    }

    /// The response as the layer would store it: its record (`None` when the layer's rules
    /// do not store it) and the response to return, its body read up to the limit.
    pub(super) async fn prepare<R: IntoResponse>(
        &self,
        response: R,
    ) -> Result<Prepared, ClaimError> {
        let (parts, body) = response.into_response().into_parts();
        let rules = self.rules();
        if !rules.should_store(&parts) {
            return Ok(Prepared {
                parts,
                body,
                completion: None,
            });
        }
        let mut body = Box::pin(body);
        let mut collector = Collector::default();
        let mut trailers = None;
        let collected = poll_fn(|cx| {
            collector.poll_collect(body.as_mut(), rules.response_limit(), &mut trailers, cx)
        })
        .await;
        let (completion, body) = match collected {
            Collected::Complete => {
                let data = collector.finish();
                if trailers
                    .as_ref()
                    .is_some_and(|t| !rules.should_store_trailers(t))
                {
                    // E.g. a gRPC `UNAVAILABLE` in the trailers: released, like the status.
                    let body = BufferedBody::<Body>::full_with_trailers(data, trailers);
                    return Ok(Prepared {
                        parts,
                        body: Body::new(body),
                        completion: None,
                    });
                }
                let stored = StoredResponse {
                    status: parts.status,
                    headers: storable_headers(&parts.headers, rules.strip_headers()),
                    body: data.clone(),
                    trailers: trailers.clone(),
                };
                let body = Body::new(BufferedBody::<Body>::full_with_trailers(data, trailers));
                (Completion::Response(stored), body)
            }
            Collected::Over(data) => {
                let prefix = collector.finish_with(data);
                (
                    Completion::NotReplayable,
                    Body::new(BufferedBody::prefixed(prefix, body)),
                )
            }
            Collected::Failed(error) => return Err(ClaimError::body(error)),
        };
        Ok(Prepared {
            parts,
            body,
            completion: Some(completion),
        })
    }

    async fn record_on(
        &self,
        connection: &mut PgConnection,
        completion: &Completion,
    ) -> Result<Transaction, ClaimError> {
        let done = self
            .store()
            .complete_on(
                connection,
                self.key(),
                self.token(),
                completion,
                self.retention(),
            )
            .await
            .map_err(ClaimError::store)?;
        match done {
            CompletedOn::Written(transaction) => Ok(transaction),
            CompletedOn::AlreadyCompleted => Err(ClaimError::already_completed()),
            CompletedOn::Lost => Err(ClaimError::lost()),
        }
    }
}
