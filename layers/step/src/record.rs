//! The records a step keeps: its result (through the codec) or an unknown outcome, and the
//! marker written before an unkeyed call is sent.

use http::{HeaderName, HeaderValue, StatusCode};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tower_once_idempotency::fingerprint::Fingerprint;
use tower_once_idempotency::store::StoredResponse;

/// On an unknown-outcome record: what it holds (a done step's record has no mark; records
/// written with a "done" mark still read as done).
pub(crate) const STEP_RECORD: HeaderName = HeaderName::from_static("tower-once-step");
/// On an unknown-outcome record: when the call was sent (milliseconds since the epoch).
const SENT_AT: HeaderName = HeaderName::from_static("tower-once-step-sent-at");
/// On an unknown-outcome record: the key the call carried downstream.
const KEY: HeaderName = HeaderName::from_static("tower-once-step-key");

/// A record as the step reads it.
pub(crate) enum Recorded<'a> {
    Done(&'a StoredResponse),
    Unknown {
        sent_at: SystemTime,
        key: Option<String>,
    },
}

/// Marks `record` (the codec's) as a done step's: by what it lacks (an unknown outcome's
/// mark), so a replay clones no header the codec did not write.
pub(crate) fn done(record: StoredResponse) -> StoredResponse {
    record
}

/// The record of a step whose outcome is unknown: sent at `sent_at` carrying `key`, never
/// recorded.
pub(crate) fn unknown(sent_at: SystemTime, key: &str) -> StoredResponse {
    let mut record = StoredResponse::new(StatusCode::OK, Default::default(), Default::default());
    record
        .headers
        .insert(STEP_RECORD, HeaderValue::from_static("unknown"));
    record
        .headers
        .insert(SENT_AT, HeaderValue::from(millis(sent_at)));
    if let Ok(key) = HeaderValue::from_str(key) {
        record.headers.insert(KEY, key);
    }
    record
}

pub(crate) fn read(record: &StoredResponse) -> Option<Recorded<'_>> {
    let Some(mark) = record.headers.get(STEP_RECORD) else {
        return Some(Recorded::Done(record));
    };
    match mark.as_bytes() {
        b"done" => Some(Recorded::Done(record)),
        b"unknown" => {
            let sent_at = record
                .headers
                .get(SENT_AT)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok())
                .map_or(UNIX_EPOCH, from_millis);
            let key = record
                .headers
                .get(KEY)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            Some(Recorded::Unknown { sent_at, key })
        }
        _ => None,
    }
}

/// The marker's fingerprint: a tag and when the call was sent.
pub(crate) fn sent_marker(sent_at: SystemTime) -> Fingerprint {
    let mut out = [0; 32];
    out[..16].copy_from_slice(b"tower-once sent\x01");
    out[16..24].copy_from_slice(&millis(sent_at).to_be_bytes());
    Fingerprint::from_bytes(out)
}

/// When the call a marker stands for was sent.
pub(crate) fn marker_sent_at(marker: &Fingerprint) -> SystemTime {
    let bytes = marker.as_bytes();
    if &bytes[..16] != b"tower-once sent\x01" {
        return UNIX_EPOCH;
    }
    let mut ms = [0; 8];
    ms.copy_from_slice(&bytes[16..24]);
    from_millis(u64::from_be_bytes(ms))
}

/// `at`, to the millisecond: what a record keeps of it.
pub(crate) fn to_millis(at: SystemTime) -> SystemTime {
    from_millis(millis(at))
}

fn millis(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn from_millis(ms: u64) -> SystemTime {
    UNIX_EPOCH
        .checked_add(Duration::from_millis(ms))
        .unwrap_or(UNIX_EPOCH)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_marker_keeps_when_it_was_sent_to_the_millisecond() {
        let at = UNIX_EPOCH + Duration::from_millis(1_764_000_000_123);
        assert_eq!(marker_sent_at(&sent_marker(at)), at);
        let unknown = unknown(at, "step-1");
        assert!(matches!(
            read(&unknown),
            Some(Recorded::Unknown { sent_at, key: Some(key) }) if sent_at == at && key == "step-1"
        ));
    }
}
