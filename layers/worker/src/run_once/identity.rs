//! The run-once record of a job: its key (from the job id) and its fingerprint (from the
//! stream entry that claims it).

use crate::job::JobId;
use sha2::{Digest, Sha256};
use tower_once_idempotency::fingerprint::Fingerprint;
use tower_once_idempotency::store::StoreKey;

/// The store key of a job id: SHA-256 over a fixed prefix and the id, so job records never
/// collide with the HTTP idempotency records in the same store.
pub fn job_store_key(job_id: &JobId) -> StoreKey {
    let mut hasher = Sha256::new();
    hasher.update(b"tower-once/job/v1\0");
    hasher.update(job_id.as_str().as_bytes());
    StoreKey::from_bytes(hasher.finalize().into())
}

/// The fingerprint of a stream entry: which entry holds a job id's claim.
pub(super) fn entry_fingerprint(stream_id: &str) -> Fingerprint {
    let mut hasher = Sha256::new();
    hasher.update(b"tower-once/worker/entry/v1");
    hasher.update(stream_id.as_bytes());
    Fingerprint::from_bytes(hasher.finalize().into())
}
