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
        let mut info = redis::cmd("XINFO");
        info.arg("GROUPS").arg(&self.stream);
        let groups: Value = query(&mut conn, &info, self.timeout).await?;
        let Some(min_id) = self.oldest_needed(&mut conn, groups).await? else {
            return Ok(0);
        };
        let mut trim = redis::cmd("XTRIM");
        trim.arg(&self.stream).arg("MINID").arg(min_id);
        query(&mut conn, &trim, self.timeout).await
    }

    async fn oldest_needed(
        &self,
        conn: &mut C,
        groups: Value,
    ) -> Result<Option<StreamId>, WorkerError> {
        let Value::Array(groups) = groups else {
            return Err(WorkerError::reply("XINFO GROUPS: not an array"));
        };
        let mut oldest: Option<StreamId> = None;
        for group in groups {
            let (name, last_delivered) = group_fields(group)?;
            let mut summary = redis::cmd("XPENDING");
            summary.arg(&self.stream).arg(&name);
            let reply: Value = query(conn, &summary, self.timeout).await?;
            let mut needed = last_delivered;
            if let Some(pending) = oldest_pending(reply)? {
                needed = needed.min(pending);
            }
            oldest = Some(oldest.map_or(needed, |o| o.min(needed)));
        }
        Ok(oldest)
    }
}

/// A stream id, ordered as Redis orders them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct StreamId(u64, u64);

impl StreamId {
    pub(crate) fn parse(s: &str) -> Option<Self> {
        let (ms, seq) = s.split_once('-')?;
        Some(Self(ms.parse().ok()?, seq.parse().ok()?))
    }
}

impl redis::ToRedisArgs for StreamId {
    fn write_redis_args<W: ?Sized + redis::RedisWrite>(&self, out: &mut W) {
        out.write_arg_fmt(format_args!("{}-{}", self.0, self.1));
    }
}

impl redis::ToSingleRedisArg for StreamId {}

/// The name and last-delivered id of one `XINFO GROUPS` row.
fn group_fields(group: Value) -> Result<(String, StreamId), WorkerError> {
    let (mut name, mut last) = (None, None);
    for (k, v) in streams::info_row(group)? {
        match k.as_str() {
            "name" => name = Some(streams::string(v)?),
            "last-delivered-id" => last = StreamId::parse(&streams::string(v)?),
            _ => {}
        }
    }
    match (name, last) {
        (Some(name), Some(last)) => Ok((name, last)),
        _ => Err(WorkerError::reply(
            "XINFO GROUPS: no name or last-delivered-id",
        )),
    }
}

/// The smallest id of an `XPENDING <stream> <group>` summary, `None` when nothing is pending.
fn oldest_pending(summary: Value) -> Result<Option<StreamId>, WorkerError> {
    let Value::Array(mut parts) = summary else {
        return Err(WorkerError::reply("XPENDING: not an array"));
    };
    if parts.len() < 2 {
        return Err(WorkerError::reply("XPENDING: too short"));
    }
    match parts.swap_remove(1) {
        Value::Nil => Ok(None),
        v => Ok(Some(
            StreamId::parse(&streams::string(v)?).ok_or(WorkerError::reply("XPENDING: bad id"))?,
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_ids_order_numerically() {
        let a = StreamId::parse("9-5").unwrap();
        let b = StreamId::parse("10-0").unwrap();
        assert!(a < b, "not lexicographic");
        assert!(StreamId::parse("10").is_none());
        assert!(StreamId::parse("x-1").is_none());
    }
}
