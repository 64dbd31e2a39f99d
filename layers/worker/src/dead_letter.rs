//! Dead letters: how the worker writes them, and the API a person uses to look at them and
//! send them back.
//!
//! A dead letter is an entry of the dead-letter stream (default `<stream>:dead`) with the
//! fields `job_id`, `payload`, `reason` ([`DeadReason`]), `deliveries`, `stream_id` (the
//! original entry's id), `error` (the handler's error text, empty when it was not called),
//! `consumer` and `dead_at` (Unix ms).
//!
//! The worker writes it as `MULTI; XADD <dead> * ...; XACK <stream> <group> <id>; EXEC`, so
//! an entry is never both acknowledged and missing from the dead-letter stream. On Redis
//! Cluster both keys must share a slot: name the stream with a hash tag (`{jobs}` gives
//! `{jobs}:dead`). Without one, the cluster refuses the transaction (`CROSSSLOT`) and the worker
//! falls back to `XADD` then `XACK` as two commands: a crash between them leaves a dead letter
//! *and* a pending entry (a duplicate dead letter later), never a lost one.
//!
//! The worker never trims the dead-letter stream: each letter waits for a person, who lists it
//! ([`DeadLetters::list`], paged and bounded by `count`), requeues it
//! ([`DeadLetters::requeue`]) or deletes it (`XDEL`). Watch its length
//! ([`DeadLetters::count`]) or the `tower_once_worker_dead_lettered_total` counter.

use crate::error::WorkerError;
use crate::streams::{self, query, Entry};
use redis::aio::ConnectionLike;
use redis::{Script, Value};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Why an entry was dead-lettered: the `reason` field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DeadReason {
    /// It was delivered more than `max_deliveries` times; the handler was not called again.
    MaxDeliveries,
    /// The handler's outcome classified as permanent (`Action::Stop`).
    Permanent,
    /// The entry has no usable `job_id` field; the handler was not called.
    Malformed,
}

impl DeadReason {
    /// The stable field value: `max_deliveries`, `permanent`, `malformed`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::MaxDeliveries => "max_deliveries",
            Self::Permanent => "permanent",
            Self::Malformed => "malformed",
        }
    }
}

/// What goes into one dead letter.
pub(crate) struct Letter<'a> {
    pub(crate) entry: &'a Entry,
    pub(crate) reason: DeadReason,
    pub(crate) deliveries: u64,
    pub(crate) error: &'a str,
    pub(crate) consumer: &'a str,
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// Dead-letters one entry: `XADD` + `XACK` in one transaction (see the module docs).
pub(crate) async fn dead_letter<C: ConnectionLike + Send>(
    conn: &mut C,
    names: (&str, &str, &str),
    letter: Letter<'_>,
    timeout: Duration,
) -> Result<(), WorkerError> {
    let (stream, group, dead) = names;
    let entry = letter.entry;
    let mut xadd = redis::cmd("XADD");
    xadd.arg(dead)
        .arg("*")
        .arg("job_id")
        .arg(entry.field(b"job_id").unwrap_or_default())
        .arg("payload")
        .arg(entry.field(b"payload").unwrap_or_default())
        .arg("reason")
        .arg(letter.reason.as_str())
        .arg("deliveries")
        .arg(letter.deliveries)
        .arg("stream_id")
        .arg(&entry.id)
        .arg("error")
        .arg(letter.error)
        .arg("consumer")
        .arg(letter.consumer)
        .arg("dead_at")
        .arg(unix_ms());
    let xack = streams::ack_cmd(stream, group, std::slice::from_ref(&entry.id));
    let mut pipe = redis::pipe();
    pipe.atomic()
        .add_command(xadd.clone())
        .add_command(xack.clone());
    let sent = tokio::time::timeout(timeout, pipe.query_async::<Value>(conn)).await;
    match sent {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) if e.code() == Some("CROSSSLOT") => {
            // NOTE: order matters: a crash in between must leave the entry pending, not lost.
            query::<_, Value>(conn, &xadd, timeout).await?;
            query::<_, Value>(conn, &xack, timeout).await?;
            Ok(())
        }
        Ok(Err(e)) => Err(WorkerError::redis(e)),
        Err(_) => Err(WorkerError::timeout()),
    }
}

/// One entry of the dead-letter stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    /// Its id in the dead-letter stream (what [`DeadLetters::requeue`] takes).
    pub dead_id: String,
    /// The `job_id` field.
    pub job_id: String,
    /// The `payload` field.
    pub payload: Vec<u8>,
    /// The `reason` field (see [`DeadReason::as_str`]).
    pub reason: String,
    /// The `deliveries` field.
    pub deliveries: u64,
    /// The original entry's id in the stream.
    pub stream_id: String,
    /// The handler's error text (empty when it was not called).
    pub error: String,
}

impl DeadLetter {
    fn from_entry(entry: Entry) -> Self {
        let text = |name: &[u8]| {
            String::from_utf8_lossy(entry.field(name).unwrap_or_default()).into_owned()
        };
        Self {
            job_id: text(b"job_id"),
            payload: entry.field(b"payload").unwrap_or_default().to_vec(),
            reason: text(b"reason"),
            deliveries: text(b"deliveries").parse().unwrap_or(0),
            stream_id: text(b"stream_id"),
            error: text(b"error"),
            dead_id: entry.id,
        }
    }
}

/// Moves a dead letter back: `XADD <stream> * job_id .. payload .. requeued_from <dead id>` and
/// `XDEL <dead> <dead id>`, atomically, and only if the dead letter still exists (two people
/// requeueing the same letter enqueue it once). A script rather than `MULTI`, because the read
/// and the writes must be one step. `KEYS` dead, stream; `ARGV` dead id.
const REQUEUE_SCRIPT: &str = r"
local e = redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[1])
if #e == 0 then return false end
local f = e[1][2]
local job_id, payload = '', ''
for i = 1, #f, 2 do
  if f[i] == 'job_id' then job_id = f[i + 1] end
  if f[i] == 'payload' then payload = f[i + 1] end
end
local id = redis.call('XADD', KEYS[2], '*', 'job_id', job_id, 'payload', payload, 'requeued_from', ARGV[1])
redis.call('XDEL', KEYS[1], ARGV[1])
return id
";

/// The dead-letter stream of one worker stream: list and requeue.
///
/// ```no_run
/// use tower_once_worker::dead_letter::DeadLetters;
/// use tower_once_worker::redis::aio::ConnectionManager;
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let client = tower_once_worker::redis::Client::open("redis://127.0.0.1:6379")?;
/// let dead = DeadLetters::new(ConnectionManager::new(client).await?, "jobs");
/// for letter in dead.list("-", 100).await? {
///     println!("{} {} after {} deliveries: {}", letter.job_id, letter.reason, letter.deliveries, letter.error);
///     if letter.reason == "permanent" && letter.error.contains("fixed upstream") {
///         dead.requeue(&letter.dead_id).await?;
///     }
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct DeadLetters<C> {
    conn: C,
    stream: String,
    dead: String,
    timeout: Duration,
    requeue: Script,
}

impl<C: ConnectionLike + Clone + Send> DeadLetters<C> {
    /// The dead letters of `stream` (in `<stream>:dead`).
    pub fn new(conn: C, stream: impl Into<String>) -> Self {
        let stream = stream.into();
        Self {
            conn,
            dead: format!("{stream}{}", crate::config::DEAD_LETTER_SUFFIX),
            stream,
            timeout: crate::config::DEFAULT_COMMAND_TIMEOUT,
            requeue: Script::new(REQUEUE_SCRIPT),
        }
    }

    /// Another dead-letter stream name (as given to
    /// [`WorkerConfig::dead_letter_stream`](crate::WorkerConfig::dead_letter_stream)).
    pub fn dead_letter_stream(mut self, name: impl Into<String>) -> Self {
        self.dead = name.into();
        self
    }

    /// Up to `count` dead letters from id `start` on (`-` for the oldest), oldest first. Page
    /// with `(` + the last `dead_id` seen as the next `start`.
    pub async fn list(&self, start: &str, count: usize) -> Result<Vec<DeadLetter>, WorkerError> {
        let mut cmd = redis::cmd("XRANGE");
        cmd.arg(&self.dead)
            .arg(start)
            .arg("+")
            .arg("COUNT")
            .arg(count.max(1));
        let reply: Value = query(&mut self.conn.clone(), &cmd, self.timeout).await?;
        Ok(streams::parse_entries(reply)?
            .into_iter()
            .map(DeadLetter::from_entry)
            .collect())
    }

    /// How many dead letters there are (`XLEN`).
    pub async fn count(&self) -> Result<u64, WorkerError> {
        let mut cmd = redis::cmd("XLEN");
        cmd.arg(&self.dead);
        query(&mut self.conn.clone(), &cmd, self.timeout).await
    }

    /// Puts dead letter `dead_id` back on the stream as a new entry (same `job_id` and
    /// `payload`, delivery count starting again at 1) and deletes it from the dead-letter
    /// stream, atomically. Returns the new entry's id, or `None` if there is no such dead
    /// letter (already requeued). On Redis Cluster the two streams must share a slot.
    pub async fn requeue(&self, dead_id: &str) -> Result<Option<String>, WorkerError> {
        let mut invocation = self.requeue.key(&self.dead);
        invocation.key(&self.stream).arg(dead_id);
        let mut conn = self.conn.clone();
        let reply = tokio::time::timeout(self.timeout, invocation.invoke_async::<Value>(&mut conn))
            .await
            .map_err(|_| WorkerError::timeout())??;
        match reply {
            Value::Nil | Value::Boolean(false) => Ok(None),
            other => streams::string(other).map(Some),
        }
    }
}
