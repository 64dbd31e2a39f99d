//! Adding jobs: `XADD <stream> * job_id <id> payload <bytes> enqueued_at <unix ms>`, and trimming
//! that can never delete an entry a group still needs.

use crate::error::WorkerError;
use crate::job::JobId;
use crate::streams::{self, query};
use bytes::Bytes;
use redis::aio::ConnectionLike;
use redis::Value;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Enqueues jobs on one stream.
///
/// ```no_run
/// use tower_once_worker::{JobId, Producer};
/// use tower_once_worker::redis::aio::ConnectionManager;
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let client = tower_once_worker::redis::Client::open("redis://127.0.0.1:6379")?;
/// let producer = Producer::new(ConnectionManager::new(client).await?, "jobs");
/// let stream_id = producer.enqueue(&JobId::new("order-42")?, r#"{"action":"ok"}"#).await?;
/// println!("enqueued as {stream_id}");
/// producer.trim_acknowledged().await?; // now and then, not on every enqueue
/// # Ok(())
/// # }
/// ```
///
/// # Trimming
///
/// `XADD ... MAXLEN` is not offered: it deletes the oldest entries whether or not a group has
/// processed them, losing pending jobs. [`trim_acknowledged`](Self::trim_acknowledged) trims
/// with `MINID` instead, up to the oldest entry some group still needs: for each group (from
/// `XINFO GROUPS`), the lower of its oldest pending id and its last-delivered id. Entries below
/// that have been delivered to and acknowledged by every group. New entries only get higher
/// ids and pending entries never move down, so a race with workers can only make the trim more
/// cautious. A stream with no group is never trimmed.
#[derive(Debug, Clone)]
pub struct Producer<C> {
    conn: C,
    stream: String,
    timeout: Duration,
}

impl<C: ConnectionLike + Clone + Send> Producer<C> {
    /// A producer for `stream`, with a 5 s command timeout.
    pub fn new(conn: C, stream: impl Into<String>) -> Self {
        Self {
            conn,
            stream: stream.into(),
            timeout: crate::config::DEFAULT_COMMAND_TIMEOUT,
        }
    }

    /// The longest one command may take.
    ///
    /// # Panics
    ///
    /// If `timeout` is zero.
    pub fn command_timeout(mut self, timeout: Duration) -> Self {
        assert!(
            !timeout.is_zero(),
            "Producer::command_timeout must not be zero"
        );
        self.timeout = timeout;
        self
    }

    /// Adds a job; returns its stream id. Enqueueing the same job id twice adds two entries:
    /// wrap the handler in a [`RunOnceLayer`](crate::RunOnceLayer) so its effect happens once.
    pub async fn enqueue(
        &self,
        job_id: &JobId,
        payload: impl Into<Bytes>,
    ) -> Result<String, WorkerError> {
        let enqueued_at = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            .unwrap_or(0);
        let mut cmd = redis::cmd("XADD");
        cmd.arg(&self.stream)
            .arg("*")
            .arg("job_id")
            .arg(job_id.as_str())
            .arg("payload")
            .arg(payload.into().as_ref())
            .arg("enqueued_at")
            .arg(enqueued_at);
        let reply: Value = query(&mut self.conn.clone(), &cmd, self.timeout).await?;
        streams::string(reply)
    }

    /// Trims entries every group has processed (see [Trimming](Self#trimming)); returns how
    /// many were deleted.
    pub async fn trim_acknowledged(&self) -> Result<u64, WorkerError> {
        let mut conn = self.conn.clone();
        let script = redis::Script::new(TRIM_SCRIPT);
        let invocation = script.key(&self.stream);
        let reply = tokio::time::timeout(self.timeout, invocation.invoke_async::<Value>(&mut conn))
            .await
            .map_err(|_| WorkerError::timeout())??;
        match reply {
            Value::Int(n) => Ok(u64::try_from(n).unwrap_or(0)),
            _ => Err(WorkerError::reply("trim script: not an integer")),
        }
    }
}

/// Reads every group's oldest needed entry and trims below it in one step.
///
/// NOTE: reading the groups and trimming must be one atomic step: a group created between the
/// two (at `0`, as workers start by default) needs entries a trim computed without it would
/// delete. For each group the oldest needed id is the lower of its oldest pending id and its
/// last-delivered id; a stream with no group is not trimmed.
const TRIM_SCRIPT: &str = r"
local function parse(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  return tonumber(ms), tonumber(seq)
end
local function lower(a, b)
  if a == nil then return b end
  local am, as = parse(a)
  local bm, bs = parse(b)
  if bm < am or (bm == am and bs < as) then return b end
  return a
end
local groups = redis.call('XINFO', 'GROUPS', KEYS[1])
local oldest = nil
for _, g in ipairs(groups) do
  local name, last
  for i = 1, #g, 2 do
    if g[i] == 'name' then name = g[i + 1] end
    if g[i] == 'last-delivered-id' then last = g[i + 1] end
  end
  local needed = last
  local pending = redis.call('XPENDING', KEYS[1], name)
  if pending[1] > 0 and pending[2] then needed = lower(needed, pending[2]) end
  oldest = lower(oldest, needed)
end
if oldest == nil then return 0 end
return redis.call('XTRIM', KEYS[1], 'MINID', oldest)
";
