//! Errors: what a handler returns ([`JobError`]), and what the worker's own Redis calls return
//! ([`WorkerError`]).

use std::error::Error as StdError;
use std::fmt;
use std::time::Duration;

/// A boxed error, as tower services commonly return.
pub type BoxError = Box<dyn StdError + Send + Sync>;

/// A handler's failure, marked transient (worth another delivery) or permanent (dead-letter it
/// now).
///
/// [`JobClassifier`](classify/struct.JobClassifier.html), the worker's default classifier, reads
/// the mark: a transient error leaves the entry pending for redelivery, a permanent one
/// dead-letters it at once. Wrapped in other errors (a `Box<dyn Error>`, a
/// [`RetryError`](tower_once_retry::RetryError), a
/// [`RunOnceError`](crate::run_once::RunOnceError)) the mark is still found.
///
/// ```
/// use tower_once_worker::JobError;
///
/// let err = JobError::permanent("payload is not JSON");
/// assert!(err.is_permanent());
/// assert_eq!(err.to_string(), "permanent: payload is not JSON");
/// assert!(JobError::transient(std::io::Error::other("reset")).is_transient());
/// ```
#[derive(Debug)]
pub struct JobError {
    permanent: bool,
    redeliver_after: Option<Duration>,
    source: BoxError,
}

impl JobError {
    /// A failure another delivery may fix (an upstream is down, a lock is busy).
    pub fn transient(source: impl Into<BoxError>) -> Self {
        Self {
            permanent: false,
            redeliver_after: None,
            source: source.into(),
        }
    }

    /// A failure no delivery can fix (a malformed payload, a rejected request).
    pub fn permanent(source: impl Into<BoxError>) -> Self {
        Self {
            permanent: true,
            redeliver_after: None,
            source: source.into(),
        }
    }

    /// Asks for the next delivery after `delay` instead of after `claim_idle` (an upstream's
    /// `Retry-After`, say). The worker honours it up to `claim_idle`, the longest a stream
    /// entry can be held back; it means nothing on a permanent error. A delay shorter than
    /// the worker's `block` may wait for the read in progress, and every consumer of the group
    /// must use the same `claim_idle` (a shorter one sees the entry as claimable sooner).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_once_worker::JobError;
    ///
    /// let err = JobError::transient("429 from the model").redeliver_after(Duration::from_secs(2));
    /// assert_eq!(err.redelivery_delay(), Some(Duration::from_secs(2)));
    /// ```
    pub fn redeliver_after(mut self, delay: Duration) -> Self {
        self.redeliver_after = Some(delay);
        self
    }

    /// The delay asked for with [`redeliver_after`](Self::redeliver_after), if any.
    pub fn redelivery_delay(&self) -> Option<Duration> {
        self.redeliver_after
    }

    /// Whether the job should be dead-lettered now.
    pub fn is_permanent(&self) -> bool {
        self.permanent
    }

    /// Whether the job should stay pending for redelivery.
    pub fn is_transient(&self) -> bool {
        !self.permanent
    }

    /// The underlying error.
    pub fn into_inner(self) -> BoxError {
        self.source
    }
}

impl fmt::Display for JobError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = if self.permanent {
            "permanent"
        } else {
            "transient"
        };
        write!(f, "{kind}: {}", self.source)
    }
}

impl StdError for JobError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&*self.source)
    }
}

/// A worker, producer or dead-letter call failed.
///
/// ```
/// use tower_once_worker::WorkerError;
///
/// let err = WorkerError::invalid_job_id();
/// assert!(err.is_invalid_job_id());
/// assert!(!err.is_redis());
/// ```
#[derive(Debug)]
pub struct WorkerError {
    kind: Kind,
    source: Option<BoxError>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Redis,
    Timeout,
    Reply,
    InvalidJobId,
    Config,
}

impl WorkerError {
    pub(crate) fn redis(source: redis::RedisError) -> Self {
        Self {
            kind: Kind::Redis,
            source: Some(source.into()),
        }
    }

    pub(crate) fn timeout() -> Self {
        Self {
            kind: Kind::Timeout,
            source: None,
        }
    }

    pub(crate) fn reply(what: &'static str) -> Self {
        Self {
            kind: Kind::Reply,
            source: Some(what.into()),
        }
    }

    pub(crate) fn config(source: crate::config::ConfigError) -> Self {
        Self {
            kind: Kind::Config,
            source: Some(source.into()),
        }
    }

    /// A job id that is empty, longer than [`JobId::MAX_LEN`](crate::JobId::MAX_LEN) bytes, or
    /// not visible ASCII.
    pub fn invalid_job_id() -> Self {
        Self {
            kind: Kind::InvalidJobId,
            source: None,
        }
    }

    /// Redis answered with an error or could not be reached.
    pub fn is_redis(&self) -> bool {
        self.kind == Kind::Redis
    }

    /// A Redis command did not answer within the command timeout.
    pub fn is_elapsed(&self) -> bool {
        self.kind == Kind::Timeout
    }

    /// Redis answered with a reply of an unexpected shape.
    pub fn is_reply(&self) -> bool {
        self.kind == Kind::Reply
    }

    /// A job id was rejected.
    pub fn is_invalid_job_id(&self) -> bool {
        self.kind == Kind::InvalidJobId
    }

    /// The worker's settings were refused (see [`WorkerConfig::validate`](crate::WorkerConfig::validate)).
    pub fn is_config(&self) -> bool {
        self.kind == Kind::Config
    }

    /// The Redis error code (`NOGROUP`, `CROSSSLOT`, ...), if Redis sent one.
    pub fn redis_code(&self) -> Option<&str> {
        self.source
            .as_deref()
            .and_then(|e| e.downcast_ref::<redis::RedisError>())
            .and_then(redis::RedisError::code)
    }
}

impl fmt::Display for WorkerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.kind {
            Kind::Redis => "redis error",
            Kind::Timeout => "redis command timed out",
            Kind::Reply => "unexpected redis reply",
            Kind::InvalidJobId => "invalid job id",
            Kind::Config => "invalid worker config",
        };
        match &self.source {
            Some(source) if self.kind == Kind::Config => fmt::Display::fmt(source, f),
            Some(source) => write!(f, "{what}: {source}"),
            None => f.write_str(what),
        }
    }
}

impl StdError for WorkerError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn StdError + 'static))
    }
}

impl From<redis::RedisError> for WorkerError {
    fn from(e: redis::RedisError) -> Self {
        Self::redis(e)
    }
}
