//! Records to and from rows: headers as two parallel arrays (names, values), and the claim
//! function's row decoded without trusting it.

use crate::fingerprint::Fingerprint;
use crate::store::record::header_map;
use crate::store::{ClaimOutcome, ExistingRecord, RecordState, StoreError, StoredResponse};
use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use sqlx::postgres::PgRow;
use sqlx::Row;
use std::time::Duration;

/// A header map as the two columns that store it, in order, repeated names included.
pub(super) fn header_columns(headers: &HeaderMap) -> (Vec<&str>, Vec<&[u8]>) {
    headers
        .iter()
        .map(|(name, value)| (name.as_str(), value.as_bytes()))
        .unzip()
}

fn headers_from(names: Vec<String>, values: Vec<Vec<u8>>) -> Result<HeaderMap, StoreError> {
    if names.len() != values.len() {
        return Err(corrupt("header names and values differ in number"));
    }
    header_map(
        names
            .iter()
            .map(String::as_bytes)
            .zip(values.iter().map(Vec::as_slice)),
    )
}

fn corrupt(what: &str) -> StoreError {
    StoreError::corrupt(format!("unexpected row from the claim function: {what}"))
}

fn get<'r, T>(row: &'r PgRow, column: &str) -> Result<T, StoreError>
where
    T: sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
{
    row.try_get(column).map_err(StoreError::corrupt)
}

pub(super) fn decode_claim(row: &PgRow) -> Result<ClaimOutcome, StoreError> {
    if get::<bool>(row, "claimed")? {
        return Ok(ClaimOutcome::Claimed);
    }
    let fingerprint = get::<Option<Vec<u8>>>(row, "fingerprint")?
        .and_then(|f| <[u8; 32]>::try_from(f.as_slice()).ok())
        .map(Fingerprint::from_bytes)
        .ok_or_else(|| corrupt("bad fingerprint"))?;
    let state = get::<Option<String>>(row, "state")?.ok_or_else(|| corrupt("no state"))?;
    let state = match state.as_str() {
        "in_progress" => {
            let remaining = get::<Option<i64>>(row, "lease_ms")?.unwrap_or(0);
            RecordState::InProgress {
                lease_remaining: Duration::from_millis(u64::try_from(remaining).unwrap_or(0)),
            }
        }
        "completed" => {
            let status = get::<Option<i16>>(row, "status")?
                .and_then(|s| u16::try_from(s).ok())
                .and_then(|s| StatusCode::from_u16(s).ok())
                .ok_or_else(|| corrupt("bad status"))?;
            let headers = headers_from(
                get::<Option<Vec<String>>>(row, "header_names")?.unwrap_or_default(),
                get::<Option<Vec<Vec<u8>>>>(row, "header_values")?.unwrap_or_default(),
            )?;
            let body = get::<Option<Vec<u8>>>(row, "body")?.ok_or_else(|| corrupt("no body"))?;
            let trailers = match (
                get::<Option<Vec<String>>>(row, "trailer_names")?,
                get::<Option<Vec<Vec<u8>>>>(row, "trailer_values")?,
            ) {
                (Some(names), Some(values)) => Some(headers_from(names, values)?),
                (None, None) => None,
                _ => return Err(corrupt("half a trailer map")),
            };
            RecordState::Completed(StoredResponse {
                status,
                headers,
                body: Bytes::from(body),
                trailers,
            })
        }
        "not_replayable" => RecordState::NotReplayable,
        _ => return Err(corrupt("unknown state")),
    };
    Ok(ClaimOutcome::Existing(ExistingRecord {
        fingerprint,
        state,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn headers_keep_their_order_and_repeats() {
        let mut headers = HeaderMap::new();
        headers.append("set-cookie", HeaderValue::from_static("a=1"));
        headers.append("set-cookie", HeaderValue::from_static("b=2"));
        headers.insert("x-bin", HeaderValue::from_bytes(&[0x80, b'z']).unwrap());
        let (names, values) = header_columns(&headers);
        let names = names.into_iter().map(str::to_owned).collect();
        let values = values.into_iter().map(<[u8]>::to_vec).collect();
        assert_eq!(headers_from(names, values).unwrap(), headers);
    }

    #[test]
    fn mismatched_or_invalid_headers_are_corrupt_not_panics() {
        assert!(headers_from(vec!["a".into()], vec![])
            .unwrap_err()
            .is_corrupt());
        assert!(headers_from(vec!["bad name".into()], vec![b"v".to_vec()])
            .unwrap_err()
            .is_corrupt());
        assert!(headers_from(vec!["a".into()], vec![b"\n".to_vec()])
            .unwrap_err()
            .is_corrupt());
    }
}
