//! Why a handler could not complete its claim.
// Built only by the stores that complete in a transaction (feature `postgres`).
#![cfg_attr(not(feature = "postgres"), allow(dead_code))]

use crate::store::StoreError;
use std::error::Error as StdError;
use std::fmt;

/// A [`Claim`](super::Claim) could not be completed: do not commit the transaction.
#[derive(Debug)]
pub struct ClaimError {
    kind: Kind,
}

#[derive(Debug)]
enum Kind {
    Lost,
    AlreadyCompleted,
    Store(StoreError),
    Body(Box<dyn StdError + Send + Sync>),
    Misused(&'static str),
}

impl ClaimError {
    pub(crate) fn lost() -> Self {
        Self { kind: Kind::Lost }
    }

    pub(crate) fn already_completed() -> Self {
        Self {
            kind: Kind::AlreadyCompleted,
        }
    }

    pub(crate) fn store(error: StoreError) -> Self {
        Self {
            kind: Kind::Store(error),
        }
    }

    pub(crate) fn misused(what: &'static str) -> Self {
        Self {
            kind: Kind::Misused(what),
        }
    }

    pub(crate) fn body(error: impl Into<Box<dyn StdError + Send + Sync>>) -> Self {
        Self {
            kind: Kind::Body(error.into()),
        }
    }

    /// The claim is no longer this request's: its lease ran out (the handler was paused or
    /// slow) and the key may have been claimed by a retry. Its effects must not commit; the
    /// retry's answer is the one that counts.
    pub fn is_lost(&self) -> bool {
        matches!(self.kind, Kind::Lost)
    }

    /// The claim's record is already completed under this claim: the handler completed it
    /// once already (`respond_in` or `complete_in`, in this transaction or in one that
    /// committed). A handler completes its claim once; the first completion is the one that
    /// counts if its transaction commits.
    pub fn is_already_completed(&self) -> bool {
        matches!(self.kind, Kind::AlreadyCompleted)
    }

    /// The database failed the statement; the transaction is unusable. At `REPEATABLE READ`
    /// or `SERIALIZABLE` this is also how a lease renewal committed after the transaction's
    /// snapshot shows: its cause is Postgres's serialization failure (SQLSTATE `40001`).
    pub fn is_store(&self) -> bool {
        matches!(self.kind, Kind::Store(_))
    }

    /// The response's body failed while it was read for storing.
    pub fn is_body(&self) -> bool {
        matches!(self.kind, Kind::Body(_))
    }

    /// The claim was used in a way its store does not support (the message says which):
    /// `Claim::transaction` on a store that is not transactional or taken twice, `respond_in`
    /// or `complete_in` on a transactional store, another claim's transaction.
    pub fn is_misused(&self) -> bool {
        matches!(self.kind, Kind::Misused(_))
    }
}

impl fmt::Display for ClaimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Lost => f.write_str(
                "idempotency claim lost: its lease ran out and the key may belong to a retry now; \
                 do not commit",
            ),
            Kind::AlreadyCompleted => f.write_str(
                "idempotency claim already completed: a handler completes its claim once \
                 (respond_in or complete_in)",
            ),
            Kind::Store(error) => write!(f, "could not complete the idempotency claim: {error}"),
            Kind::Body(error) => write!(f, "the response body failed while being stored: {error}"),
            Kind::Misused(what) => write!(f, "idempotency claim misused: {what}"),
        }
    }
}

impl StdError for ClaimError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        match &self.kind {
            Kind::Lost | Kind::AlreadyCompleted | Kind::Misused(_) => None,
            Kind::Store(error) => Some(error),
            Kind::Body(error) => Some(error.as_ref()),
        }
    }
}

/// A lost claim answers `409 Conflict` (the key is another request's now: retrying later
/// replays its answer), a store failure `503 Service Unavailable`, a second completion or a
/// failed body `500`. The layer never stores these answers as the key's, whatever its
/// [`store_when`](crate::IdempotencyLayer::store_when) predicate says: it releases the claim
/// (a write fenced by the claim, which changes nothing once the record is completed or
/// another's), so the retry runs the handler.
impl axum::response::IntoResponse for ClaimError {
    fn into_response(self) -> axum::response::Response {
        let status = match self.kind {
            Kind::Lost => http::StatusCode::CONFLICT,
            Kind::Store(_) => http::StatusCode::SERVICE_UNAVAILABLE,
            Kind::AlreadyCompleted | Kind::Body(_) | Kind::Misused(_) => {
                http::StatusCode::INTERNAL_SERVER_ERROR
            }
        };
        let mut response = (status, self.to_string()).into_response();
        response.extensions_mut().insert(Refused);
        response
    }
}

/// Put on the response of a [`ClaimError`], so that the layer releases the claim instead of
/// storing that response.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Refused;
