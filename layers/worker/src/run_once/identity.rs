//! A job as run-once sees it: its key (from the job id) and its delivery (the stream entry
//! that claims it).

use crate::job::{Job, JobId};
use sha2::{Digest, Sha256};
use tower_once_core::deadline::Deadline;
use tower_once_idempotency::fingerprint::Fingerprint;
use tower_once_idempotency::store::StoreKey;
use tower_once_step::run_once::Delivery;
use tower_once_step::StepRequest;

/// The store key of a job id: SHA-256 over a fixed prefix and the id, so job records never
/// collide with the HTTP idempotency records in the same store.
pub fn job_store_key(job_id: &JobId) -> StoreKey {
    let mut hasher = Sha256::new();
    hasher.update(b"tower-once/job/v1\0");
    hasher.update(job_id.as_str().as_bytes());
    StoreKey::from_bytes(hasher.finalize().into())
}

/// The fingerprint of a stream entry: which entry holds a job id's claim.
fn entry_fingerprint(stream_id: &str) -> Fingerprint {
    let mut hasher = Sha256::new();
    hasher.update(b"tower-once/worker/entry/v1");
    hasher.update(stream_id.as_bytes());
    Fingerprint::from_bytes(hasher.finalize().into())
}

impl StepRequest for Job {
    fn deadline(&self) -> Option<Deadline> {
        Job::deadline(self)
    }

    fn extensions(&self) -> Option<&http::Extensions> {
        Some(Job::extensions(self))
    }

    fn extensions_mut(&mut self) -> Option<&mut http::Extensions> {
        Some(Job::extensions_mut(self))
    }
}

/// A job is run once per job id; its delivery is its stream entry.
impl Delivery for Job {
    fn once_key(&self) -> StoreKey {
        job_store_key(self.job_id())
    }

    // NOTE: the record's fingerprint names the stream entry that claimed it, so that a second
    // delivery can tell another entry with the same job id (a duplicate enqueue: acknowledged
    // as a duplicate, the running entry stays pending until it is done) from the same entry
    // delivered again while it runs (left pending: acknowledging it could lose the job if the
    // running delivery then fails).
    fn delivery(&self) -> Fingerprint {
        entry_fingerprint(self.stream_id())
    }
}
