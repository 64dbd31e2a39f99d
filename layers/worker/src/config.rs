//! The worker's settings and their defaults, checked once by [`WorkerConfig::validate`] (which
//! [`Worker::new`](crate::Worker::new) calls), never while jobs run.

use std::fmt;
use std::time::Duration;

/// Default: entries idle longer than this are taken over by `XAUTOCLAIM`.
pub const DEFAULT_CLAIM_IDLE: Duration = Duration::from_secs(30);
/// Default: deliveries before an entry is dead-lettered unrun.
pub const DEFAULT_MAX_DELIVERIES: u64 = 5;
/// Default: jobs in flight at once.
pub const DEFAULT_CONCURRENCY: usize = 16;
/// Default: the longest `XREADGROUP ... BLOCK`.
pub const DEFAULT_BLOCK: Duration = Duration::from_secs(2);
/// Default: the deadline of one delivery.
pub const DEFAULT_JOB_DEADLINE: Duration = Duration::from_secs(300);
/// Default: how long shutdown waits for in-flight jobs.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(30);
/// Default: the longest one non-blocking Redis command may take.
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(5);
/// The suffix of the default dead-letter stream: `<stream>:dead`.
pub const DEAD_LETTER_SUFFIX: &str = ":dead";

/// Where a worker reads, as whom, and how it paces itself.
///
/// ```
/// use std::time::Duration;
/// use tower_once_worker::WorkerConfig;
///
/// let config = WorkerConfig::new("{jobs}", "workers")
///     .consumer("worker-1")
///     .claim_idle(Duration::from_secs(10))
///     .max_deliveries(3)
///     .concurrency(64);
/// assert_eq!(config.dead_letter_stream_name(), "{jobs}:dead");
/// assert!(config.validate().is_ok());
/// assert!(WorkerConfig::new("jobs", "workers").concurrency(0).validate().is_err());
/// ```
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    pub(crate) stream: String,
    pub(crate) group: String,
    pub(crate) consumer: String,
    pub(crate) dead_letter: String,
    pub(crate) group_start: String,
    pub(crate) claim_idle: Duration,
    pub(crate) max_deliveries: u64,
    pub(crate) concurrency: usize,
    pub(crate) batch_size: usize,
    pub(crate) block: Duration,
    pub(crate) job_deadline: Duration,
    pub(crate) shutdown_grace: Duration,
    pub(crate) command_timeout: Duration,
}

impl WorkerConfig {
    /// Settings for consumer group `group` on `stream`, with the defaults: consumer name
    /// `<hostname>-<pid>`, dead letters to `<stream>:dead`, the group created at `0` (every
    /// entry already in the stream), claim idle 30 s, 5 deliveries, 16 in flight, batches of
    /// up to 16, `BLOCK` 2 s, job deadline 5 min, shutdown grace 30 s, command timeout 5 s.
    pub fn new(stream: impl Into<String>, group: impl Into<String>) -> Self {
        let stream = stream.into();
        Self {
            dead_letter: format!("{stream}{DEAD_LETTER_SUFFIX}"),
            stream,
            group: group.into(),
            consumer: default_consumer_name(),
            group_start: "0".to_owned(),
            claim_idle: DEFAULT_CLAIM_IDLE,
            max_deliveries: DEFAULT_MAX_DELIVERIES,
            concurrency: DEFAULT_CONCURRENCY,
            batch_size: DEFAULT_CONCURRENCY,
            block: DEFAULT_BLOCK,
            job_deadline: DEFAULT_JOB_DEADLINE,
            shutdown_grace: DEFAULT_SHUTDOWN_GRACE,
            command_timeout: DEFAULT_COMMAND_TIMEOUT,
        }
    }

    /// This worker's consumer name in the group. Must be unique among live workers: two
    /// processes sharing one name would refresh and acknowledge each other's entries.
    pub fn consumer(mut self, name: impl Into<String>) -> Self {
        self.consumer = name.into();
        self
    }

    /// The dead-letter stream. Default `<stream>:dead`; on Redis Cluster it must hash to the
    /// stream's slot (give the stream a hash tag, `{jobs}`) for dead-lettering to be atomic.
    pub fn dead_letter_stream(mut self, name: impl Into<String>) -> Self {
        self.dead_letter = name.into();
        self
    }

    /// Where a group created by the worker starts: `0` (default, every entry in the stream) or
    /// `$` (only entries added from now on).
    pub fn group_start(mut self, id: impl Into<String>) -> Self {
        self.group_start = id.into();
        self
    }

    /// How long an entry must sit idle in a consumer's pending list before another consumer
    /// takes it over. A live worker refreshes its in-flight entries every third of this, so it
    /// need not exceed the slowest job; it bounds how long a crashed worker's jobs wait.
    pub fn claim_idle(mut self, idle: Duration) -> Self {
        self.claim_idle = idle;
        self
    }

    /// Deliveries allowed; the next one dead-letters the entry without calling the handler.
    pub fn max_deliveries(mut self, max: u64) -> Self {
        self.max_deliveries = max;
        self
    }

    /// Jobs in flight at once. The worker never reads more entries than it has free slots, so
    /// the rest wait in the stream, not in memory. Also sets the batch size to the same value.
    pub fn concurrency(mut self, jobs: usize) -> Self {
        self.concurrency = jobs;
        self.batch_size = jobs;
        self
    }

    /// The most entries one `XREADGROUP`/`XAUTOCLAIM` asks for (capped by free slots).
    pub fn batch_size(mut self, entries: usize) -> Self {
        self.batch_size = entries;
        self
    }

    /// The longest `XREADGROUP ... BLOCK` (shortened to a sixth of `claim_idle` so takeovers are
    /// not delayed by an idle stream).
    pub fn block(mut self, block: Duration) -> Self {
        self.block = block;
        self
    }

    /// The deadline of one delivery: in scope while the handler is called and polled (a
    /// `TimeoutLayer` or `RetryLayer` inside reads it), and enforced by the worker, which drops the handler's
    /// future when it passes and leaves the entry pending.
    pub fn job_deadline(mut self, deadline: Duration) -> Self {
        self.job_deadline = deadline;
        self
    }

    /// How long shutdown waits for in-flight jobs before dropping them (their entries stay
    /// pending and are redelivered elsewhere).
    pub fn shutdown_grace(mut self, grace: Duration) -> Self {
        self.shutdown_grace = grace;
        self
    }

    /// The longest a single non-blocking Redis command may take.
    pub fn command_timeout(mut self, timeout: Duration) -> Self {
        self.command_timeout = timeout;
        self
    }

    /// The stream.
    pub fn stream_name(&self) -> &str {
        &self.stream
    }

    /// The consumer group.
    pub fn group_name(&self) -> &str {
        &self.group
    }

    /// This worker's consumer name.
    pub fn consumer_name(&self) -> &str {
        &self.consumer
    }

    /// The dead-letter stream.
    pub fn dead_letter_stream_name(&self) -> &str {
        &self.dead_letter
    }

    /// How often in-flight entries are refreshed: a third of `claim_idle`.
    pub fn refresh_interval(&self) -> Duration {
        self.claim_idle / 3
    }

    /// How often the worker looks for idle entries to take over: half of `claim_idle`.
    pub fn claim_interval(&self) -> Duration {
        self.claim_idle / 2
    }

    /// The `BLOCK` actually used.
    pub fn effective_block(&self) -> Duration {
        self.block
            .min(self.claim_idle / 6)
            .max(Duration::from_millis(1))
    }

    /// Checks every setting; [`Worker::new`](crate::Worker::new) calls it.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let names = [
            (&self.stream, "stream name is empty"),
            (&self.group, "group name is empty"),
            (&self.consumer, "consumer name is empty"),
            (&self.dead_letter, "dead-letter stream name is empty"),
            (&self.group_start, "group start id is empty"),
        ];
        for (name, problem) in names {
            if name.is_empty() {
                return Err(ConfigError(problem));
            }
        }
        if self.dead_letter == self.stream {
            return Err(ConfigError("dead-letter stream is the stream itself"));
        }
        if self.claim_idle < Duration::from_millis(30) {
            return Err(ConfigError("claim_idle must be at least 30 ms"));
        }
        if self.max_deliveries == 0 {
            return Err(ConfigError("max_deliveries must be at least 1"));
        }
        if self.concurrency == 0 || self.concurrency > 10_000 {
            return Err(ConfigError("concurrency must be within 1..=10000"));
        }
        if self.batch_size == 0 {
            return Err(ConfigError("batch_size must be at least 1"));
        }
        if self.block.is_zero() {
            // BLOCK 0 means "forever" to Redis: shutdown and takeovers would hang.
            return Err(ConfigError("block must not be zero"));
        }
        if self.job_deadline.is_zero() || self.command_timeout.is_zero() {
            return Err(ConfigError(
                "job_deadline and command_timeout must not be zero",
            ));
        }
        Ok(())
    }
}

/// `<hostname>-<pid>`, or `worker-<pid>` when the hostname is unknown.
pub fn default_consumer_name() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty() && h.bytes().all(|b| b.is_ascii_graphic()))
        .unwrap_or_else(|| "worker".to_owned());
    format!("{host}-{}", std::process::id())
}

/// A [`WorkerConfig`] setting that cannot work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConfigError(&'static str);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid worker config: {}", self.0)
    }
}

impl std::error::Error for ConfigError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_bad_values_are_refused() {
        let ok = WorkerConfig::new("jobs", "g");
        assert!(ok.validate().is_ok());
        assert_eq!(ok.dead_letter_stream_name(), "jobs:dead");
        assert!(!ok.consumer_name().is_empty());
        let bad = [
            ok.clone().consumer(""),
            ok.clone().max_deliveries(0),
            ok.clone().block(Duration::ZERO),
            ok.clone().claim_idle(Duration::from_millis(1)),
            ok.clone().batch_size(0),
            ok.clone().dead_letter_stream("jobs"),
            WorkerConfig::new("", "g"),
        ];
        for config in bad {
            assert!(config.validate().is_err(), "{config:?}");
        }
    }

    #[test]
    fn block_never_delays_takeovers() {
        let c = WorkerConfig::new("jobs", "g").claim_idle(Duration::from_millis(300));
        assert_eq!(c.effective_block(), Duration::from_millis(50));
        assert_eq!(c.refresh_interval(), Duration::from_millis(100));
    }
}
