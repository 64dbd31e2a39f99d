//! Encoding stored headers, and decoding the scripts' replies without trusting them.

use crate::fingerprint::Fingerprint;
use crate::store::record::header_map;
use crate::store::{ClaimOutcome, ExistingRecord, RecordState, StoreError, StoredResponse};
use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use redis::Value;
use std::time::Duration;

pub(super) fn encode_headers(headers: &HeaderMap) -> Result<Vec<u8>, StoreError> {
    let pairs: Vec<(&str, &[u8])> = headers
        .iter()
        .map(|(name, value)| (name.as_str(), value.as_bytes()))
        .collect();
    postcard::to_allocvec(&pairs).map_err(StoreError::corrupt)
}

pub(super) fn decode_headers(bytes: &[u8]) -> Result<HeaderMap, StoreError> {
    let pairs: Vec<(&str, &[u8])> = postcard::from_bytes(bytes).map_err(StoreError::corrupt)?;
    header_map(
        pairs
            .into_iter()
            .map(|(name, value)| (name.as_bytes(), value)),
    )
}

pub(super) fn corrupt(what: &str) -> StoreError {
    StoreError::corrupt(format!("unexpected reply from the claim script: {what}"))
}

pub(super) fn bulk(value: Option<Value>) -> Option<Vec<u8>> {
    match value? {
        Value::BulkString(bytes) => Some(bytes),
        Value::SimpleString(s) => Some(s.into_bytes()),
        _ => None,
    }
}

pub(super) fn decode_flag(value: Value) -> Result<bool, StoreError> {
    match value {
        Value::Int(flag) => Ok(flag == 1),
        _ => Err(StoreError::corrupt(
            "expected an integer reply from a store script",
        )),
    }
}

pub(super) fn decode_claim(value: Value) -> Result<ClaimOutcome, StoreError> {
    let Value::Array(items) = value else {
        return Err(corrupt("not an array"));
    };
    let mut items = items.into_iter();
    let state = bulk(items.next()).ok_or_else(|| corrupt("no state"))?;
    if state == b"claimed" {
        return Ok(ClaimOutcome::Claimed);
    }
    let fingerprint = bulk(items.next())
        .and_then(|f| <[u8; 32]>::try_from(f.as_slice()).ok())
        .map(Fingerprint::from_bytes)
        .ok_or_else(|| corrupt("bad fingerprint"))?;
    let state = match state.as_slice() {
        b"p" => {
            let remaining = match items.next() {
                Some(Value::Int(ms)) => Duration::from_millis(u64::try_from(ms).unwrap_or(0)),
                _ => return Err(corrupt("bad lease")),
            };
            RecordState::InProgress {
                lease_remaining: remaining,
            }
        }
        b"c" => {
            let status = bulk(items.next())
                .and_then(|s| StatusCode::from_bytes(&s).ok())
                .ok_or_else(|| corrupt("bad status"))?;
            let headers =
                decode_headers(&bulk(items.next()).ok_or_else(|| corrupt("no headers"))?)?;
            let body = Bytes::from(bulk(items.next()).ok_or_else(|| corrupt("no body"))?);
            let trailers = match bulk(items.next()) {
                Some(bytes) => Some(decode_headers(&bytes)?),
                None => None,
            };
            RecordState::Completed(StoredResponse {
                status,
                headers,
                body,
                trailers,
            })
        }
        b"n" => RecordState::NotReplayable,
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
    use crate::store::redis::millis;
    use http::HeaderValue;

    #[test]
    fn headers_round_trip_with_repeats_and_binary_values() {
        let mut headers = HeaderMap::new();
        headers.append("set-cookie", HeaderValue::from_static("a=1"));
        headers.append("set-cookie", HeaderValue::from_static("b=2"));
        headers.insert(
            "x-bin",
            HeaderValue::from_bytes(&[0x80, 0xfe, b'z']).unwrap(),
        );
        let decoded = decode_headers(&encode_headers(&headers).unwrap()).unwrap();
        assert_eq!(decoded, headers);
        assert_eq!(
            decode_headers(&encode_headers(&HeaderMap::new()).unwrap())
                .unwrap()
                .len(),
            0
        );
    }

    #[test]
    fn malformed_replies_are_corrupt_errors_not_panics() {
        for value in [
            Value::Nil,
            Value::Array(vec![]),
            Value::Array(vec![Value::BulkString(b"c".to_vec())]),
            Value::Array(vec![
                Value::BulkString(b"p".to_vec()),
                Value::BulkString(vec![1; 32]),
            ]),
            Value::Array(vec![
                Value::BulkString(b"x".to_vec()),
                Value::BulkString(vec![1; 32]),
            ]),
        ] {
            assert!(decode_claim(value).unwrap_err().is_corrupt());
        }
        assert!(decode_headers(b"\xff\xff\xff").unwrap_err().is_corrupt());
        assert_eq!(millis(Duration::ZERO), 1);
    }
}
