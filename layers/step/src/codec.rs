//! How a step's result is kept in the store.

use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use std::error::Error as StdError;
use tower_once_idempotency::store::StoredResponse;

type BoxError = Box<dyn StdError + Send + Sync>;

/// Turns a step's result into a stored record and back. [`Json`] is the default.
pub trait Codec<T> {
    /// The record to keep for `value`.
    fn encode(&self, value: &T) -> Result<StoredResponse, BoxError>;
    /// The value of a record this codec encoded.
    fn decode(&self, record: &StoredResponse) -> Result<T, BoxError>;
}

/// Results kept as JSON (`serde_json`): any `Serialize + DeserializeOwned` type. A value whose
/// JSON does not read back (a NaN or infinite float, written as `null`) is refused, so the
/// step is not recorded rather than recorded unreadable.
#[derive(Debug, Clone, Copy, Default)]
pub struct Json;

impl<T> Codec<T> for Json
where
    T: serde::Serialize + serde::de::DeserializeOwned,
{
    fn encode(&self, value: &T) -> Result<StoredResponse, BoxError> {
        let body = serde_json::to_vec(value)?;
        // JSON writes what it cannot read back (a NaN or an infinite float becomes `null`): a
        // result that would not replay is not a result to store.
        serde_json::from_slice::<T>(&body)
            .map_err(|e| format!("the result does not read back from its JSON: {e}"))?;
        // NOTE: no headers: a replay clones the record out of the store, and an empty header
        // map costs nothing to clone. The codec that wrote it is the one that reads it.
        Ok(StoredResponse::new(
            StatusCode::OK,
            HeaderMap::new(),
            Bytes::from(body),
        ))
    }

    fn decode(&self, record: &StoredResponse) -> Result<T, BoxError> {
        Ok(serde_json::from_slice(&record.body)?)
    }
}
