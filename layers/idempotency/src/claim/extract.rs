//! `Claim` as an axum extractor.

use super::Claim;
use axum::extract::{FromRequestParts, OptionalFromRequestParts};
use http::request::Parts;
use http::StatusCode;
use std::convert::Infallible;

/// Missing when the handler is not behind an `IdempotencyLayer` whose store hands out claims
/// (the Postgres store), or the request was not claimed (no `Idempotency-Key`, or a method the
/// layer does not cover): a `500`, since it is the server's configuration.
impl<S, St> FromRequestParts<S> for Claim<St>
where
    S: Send + Sync,
    St: Clone + Send + Sync + 'static,
{
    type Rejection = (StatusCode, &'static str);

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        parts.extensions.get::<Self>().cloned().ok_or((
            StatusCode::INTERNAL_SERVER_ERROR,
            "no idempotency claim: the request was not claimed by an IdempotencyLayer whose \
             store completes in transaction",
        ))
    }
}

/// `None` when the request was not claimed (for routes where the key is optional).
impl<S, St> OptionalFromRequestParts<S> for Claim<St>
where
    S: Send + Sync,
    St: Clone + Send + Sync + 'static,
{
    type Rejection = Infallible;

    async fn from_request_parts(
        parts: &mut Parts,
        _state: &S,
    ) -> Result<Option<Self>, Self::Rejection> {
        Ok(parts.extensions.get::<Self>().cloned())
    }
}
