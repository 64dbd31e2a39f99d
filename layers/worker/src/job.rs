//! What a handler receives: a [`Job`], named by a deterministic [`JobId`].

use crate::error::WorkerError;
use bytes::Bytes;
use std::fmt;
use tower_once_idempotency::store::StoreKey;
use tower_once_timeout::{Carrier, Deadline};

/// The namespace of [`JobId::from_scoped_key`]'s version 5 UUIDs. Fixed forever: changing it
/// would give every retried request a new job id.
pub const JOB_ID_NAMESPACE: uuid::Uuid = uuid::Uuid::from_bytes([
    0x6f, 0x6e, 0x63, 0x65, 0x2d, 0x77, 0x6f, 0x72, 0x6b, 0x65, 0x72, 0x2d, 0x6a, 0x6f, 0x62, 0x73,
]);

/// A job's identity, the `job_id` field of a stream entry: what run-once deduplicates on.
///
/// Derive it from something the producer's caller repeats on a retry (an idempotency key's
/// scoped record key, an order id), never at random: a handler that runs twice then enqueues
/// the same job id twice, and [`RunOnceLayer`](crate::RunOnceLayer) runs its effect once.
///
/// ```
/// use tower_once_idempotency::store::StoreKey;
/// use tower_once_worker::JobId;
///
/// let key = StoreKey::from_bytes([7; 32]);
/// assert_eq!(JobId::from_scoped_key(&key), JobId::from_scoped_key(&key));
/// assert_ne!(JobId::from_scoped_key(&key), JobId::from_scoped_key(&StoreKey::from_bytes([8; 32])));
/// assert_eq!(JobId::new("order-42").unwrap().as_str(), "order-42");
/// assert!(JobId::new("").is_err());
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct JobId(String);

impl JobId {
    /// The longest job id accepted, in bytes.
    pub const MAX_LEN: usize = 255;

    /// A job id from a string of 1 to [`MAX_LEN`](Self::MAX_LEN) visible ASCII characters.
    pub fn new(id: impl Into<String>) -> Result<Self, WorkerError> {
        let id = id.into();
        if Self::is_valid(id.as_bytes()) {
            Ok(Self(id))
        } else {
            Err(WorkerError::invalid_job_id())
        }
    }

    pub(crate) fn from_field(bytes: &[u8]) -> Option<Self> {
        if Self::is_valid(bytes) {
            std::str::from_utf8(bytes).ok().map(|s| Self(s.to_owned()))
        } else {
            None
        }
    }

    fn is_valid(bytes: &[u8]) -> bool {
        !bytes.is_empty() && bytes.len() <= Self::MAX_LEN && bytes.iter().all(u8::is_ascii_graphic)
    }

    /// The job id of the work an idempotency record stands for: the version 5 UUID of the
    /// record's scoped key bytes in [`JOB_ID_NAMESPACE`]. The same request, retried with the
    /// same `Idempotency-Key` by the same tenant, always yields the same job id.
    pub fn from_scoped_key(key: &StoreKey) -> Self {
        Self::from_uuid(uuid::Uuid::new_v5(&JOB_ID_NAMESPACE, key.as_bytes()))
    }

    /// A job id from a UUID, in its hyphenated form.
    pub fn from_uuid(uuid: uuid::Uuid) -> Self {
        Self(uuid.hyphenated().to_string())
    }

    /// The id as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "JobId({})", self.0)
    }
}

/// One delivery of a stream entry, as the handler service receives it.
///
/// Cloning is cheap (the payload is [`Bytes`]), so a `RetryLayer` can wrap the handler. A job
/// carries its delivery's [`Deadline`] (and a retry attempt's mark) in its
/// [`extensions`](Self::extensions): it is a [`Carrier`], so the layers of a handler see the
/// deadline even behind a `Buffer` or on another task.
///
/// ```
/// use tower_once_worker::{Job, JobId};
///
/// let job = Job::new("1700000000000-0", JobId::new("order-42").unwrap(), "{}", 1);
/// assert_eq!(job.job_id().as_str(), "order-42");
/// assert_eq!(&job.payload()[..], b"{}");
/// assert_eq!(job.deliveries(), 1);
/// ```
#[derive(Debug, Clone)]
pub struct Job {
    stream_id: String,
    job_id: JobId,
    payload: Bytes,
    deliveries: u64,
    extensions: http::Extensions,
}

impl Carrier for Job {
    fn extensions(&self) -> Option<&http::Extensions> {
        Some(&self.extensions)
    }

    fn extensions_mut(&mut self) -> Option<&mut http::Extensions> {
        Some(&mut self.extensions)
    }
}

impl Job {
    /// A job (the worker builds them from stream entries; this is for tests and adapters).
    pub fn new(
        stream_id: impl Into<String>,
        job_id: JobId,
        payload: impl Into<Bytes>,
        deliveries: u64,
    ) -> Self {
        Self {
            stream_id: stream_id.into(),
            job_id,
            payload: payload.into(),
            deliveries,
            extensions: http::Extensions::new(),
        }
    }

    /// Sets the delivery's deadline (the worker sets it from `job_deadline`); an earlier one
    /// the job carries already stays.
    pub fn with_deadline(mut self, deadline: Deadline) -> Self {
        deadline.attach(&mut self);
        self
    }

    /// The delivery's deadline. It travels with the job, so the timeout and retry layers read
    /// it when they are called later or on another task; the worker also calls and polls the
    /// handler inside its scope.
    pub fn deadline(&self) -> Option<Deadline> {
        Deadline::carried(self)
    }

    /// What travels with the job: its deadline, and whatever layers put there.
    pub fn extensions(&self) -> &http::Extensions {
        &self.extensions
    }

    /// What travels with the job, mutably.
    pub fn extensions_mut(&mut self) -> &mut http::Extensions {
        &mut self.extensions
    }

    /// The entry's id in the stream (`<ms>-<seq>`).
    pub fn stream_id(&self) -> &str {
        &self.stream_id
    }

    /// The job id (the entry's `job_id` field).
    pub fn job_id(&self) -> &JobId {
        &self.job_id
    }

    /// The entry's `payload` field (empty when the entry has none).
    pub fn payload(&self) -> &Bytes {
        &self.payload
    }

    /// How many times Redis has delivered this entry to the group, this delivery included
    /// (1 on the first delivery). Read from Redis, so it survives worker crashes.
    pub fn deliveries(&self) -> u64 {
        self.deliveries
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_ids_reject_what_redis_keys_and_logs_should_not_carry() {
        for bad in ["", " ", "a b", "é", "tab\t"] {
            assert!(JobId::new(bad).is_err(), "{bad:?}");
        }
        assert!(JobId::new("x".repeat(JobId::MAX_LEN)).is_ok());
        assert!(JobId::new("x".repeat(JobId::MAX_LEN + 1)).is_err());
        assert_eq!(JobId::from_field(b"abc"), Some(JobId::new("abc").unwrap()));
        assert_eq!(JobId::from_field(b"\xff"), None);
    }

    #[test]
    fn scoped_key_ids_are_stable_v5_uuids() {
        let id = JobId::from_scoped_key(&StoreKey::from_bytes([0; 32]));
        let uuid = uuid::Uuid::parse_str(id.as_str()).unwrap();
        assert_eq!(uuid.get_version_num(), 5);
        // Pinned (computed independently with Python's uuid/hashlib): a change here changes
        // every derived job id, and retried requests would enqueue "new" jobs.
        assert_eq!(id.as_str(), "4710a1d4-3fb5-51d5-a6c9-47c4a24c9a62");
    }
}
