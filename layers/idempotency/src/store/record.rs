//! What a store holds and answers: claim outcomes, record states, stored responses.

use crate::fingerprint::Fingerprint;
use crate::store::StoreError;
use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use std::time::Duration;

/// What [`IdempotencyStore::claim`](super::IdempotencyStore::claim) found.
// Moved once per request; boxing would add an allocation to every replay.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum ClaimOutcome {
    /// The key was free and is now in progress under the given token.
    Claimed,
    /// The key is held by an existing record, returned as it is.
    Existing(ExistingRecord),
}

/// A record that already holds a key.
#[derive(Debug, Clone)]
pub struct ExistingRecord {
    /// The fingerprint of the request that created the record.
    pub fingerprint: Fingerprint,
    /// Where the record is in its life.
    pub state: RecordState,
}

/// The state of an existing record.
// Moved once per request; boxing would add an allocation to every replay.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum RecordState {
    /// A handler is running under a claim; its lease ends after `lease_remaining`.
    InProgress {
        /// Time left on the lease.
        lease_remaining: Duration,
    },
    /// The handler finished and its response is stored.
    Completed(StoredResponse),
    /// The handler finished but its response was too large to store; it cannot be replayed.
    NotReplayable,
}

/// How an in-progress record ends, given to [`IdempotencyStore::complete`](super::IdempotencyStore::complete).
// Moved once per request; boxing would add an allocation to every replay.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum Completion {
    /// Store this response for replay.
    Response(StoredResponse),
    /// The handler ran, but its response is not kept (too large): later duplicates get an error
    /// and never run the handler again.
    NotReplayable,
}

/// A response as stored for replay: status, headers, body and trailers.
///
/// ```
/// use tower_once_idempotency::store::StoredResponse;
///
/// let mut headers = http::HeaderMap::new();
/// headers.insert("content-type", "application/json".parse().unwrap());
/// let stored = StoredResponse::new(http::StatusCode::CREATED, headers, "{}".into());
/// assert_eq!(stored.status, 201);
/// assert!(stored.trailers.is_none());
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct StoredResponse {
    /// The status code.
    pub status: StatusCode,
    /// The headers, hop-by-hop and deny-listed ones removed.
    pub headers: HeaderMap,
    /// The complete body.
    pub body: Bytes,
    /// The trailers, if the body ended with any (gRPC's `grpc-status` lives there).
    pub trailers: Option<HeaderMap>,
}

impl StoredResponse {
    /// A stored response without trailers.
    pub fn new(status: StatusCode, headers: HeaderMap, body: Bytes) -> Self {
        Self {
            status,
            headers,
            body,
            trailers: None,
        }
    }

    /// Sets the trailers.
    pub fn with_trailers(mut self, trailers: HeaderMap) -> Self {
        self.trailers = Some(trailers);
        self
    }

    /// An estimate of the bytes this record occupies (headers, body and trailers).
    pub fn approximate_size(&self) -> usize {
        fn map_size(map: &HeaderMap) -> usize {
            map.iter()
                .map(|(k, v)| k.as_str().len() + v.len() + 32)
                .sum()
        }
        64 + map_size(&self.headers) + self.body.len() + self.trailers.as_ref().map_or(0, map_size)
    }
}

/// A header map rebuilt from stored name/value pairs, in order, repeats kept: the one decoder
/// of every store that keeps headers as pairs. A name or value that is not a valid header is
/// a corrupt record, never a panic.
#[cfg_attr(not(any(feature = "redis", feature = "postgres")), allow(dead_code))]
pub(crate) fn header_map<'a>(
    pairs: impl ExactSizeIterator<Item = (&'a [u8], &'a [u8])>,
) -> Result<HeaderMap, StoreError> {
    let mut headers = HeaderMap::with_capacity(pairs.len());
    for (name, value) in pairs {
        headers.append(
            HeaderName::from_bytes(name).map_err(StoreError::corrupt)?,
            HeaderValue::from_bytes(value).map_err(StoreError::corrupt)?,
        );
    }
    Ok(headers)
}

/// What became of a record a handler wrote in its own transaction, read once it returned.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
pub enum Settled {
    /// Completed under this claim (or no longer this claim's, or its transaction too old to
    /// tell): the layer writes nothing more.
    Done,
    /// Its transaction is still open (handed to a task, or its rollback not sent yet): its end
    /// decides. A request's layer writes nothing more (the lease frees the key if it never
    /// commits); a job's does not acknowledge it before that end.
    Open,
    /// Its transaction committed without it (a savepoint around it rolled back): the layer
    /// stores the response by its own rules, as if the handler had not.
    Store,
    /// Its transaction rolled back, the record with it: the layer releases the claim.
    Release,
}
