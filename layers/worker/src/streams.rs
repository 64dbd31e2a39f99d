//! The Redis Streams commands the worker sends, and the parsing of their replies. Every reply
//! is checked for shape; nothing here panics on what Redis (or another client) wrote.

use crate::error::WorkerError;
use redis::aio::ConnectionLike;
use redis::{Cmd, FromRedisValue, Value};
use std::collections::HashMap;
use std::time::Duration;

/// The owner-checked refresh: `XCLAIM ... 0 <id> JUSTID` only for entries still pending under
/// this consumer. A bare `XCLAIM` would also take back an entry that another consumer already
/// took over, and two workers would run it. `JUSTID` leaves the delivery count alone.
/// `KEYS[1]` stream; `ARGV` group, consumer, ids... Returns the ids still held.
pub(crate) const REFRESH_SCRIPT: &str = r"
local kept = {}
for i = 3, #ARGV do
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1)
  if p[1] and p[1][2] == ARGV[2] then
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[i], 'JUSTID')
    kept[#kept + 1] = ARGV[i]
  end
end
return kept
";

/// Holds a pending entry back: sets its idle time (ARGV[4] ms) so that it becomes claimable
/// after `claim_idle - idle`, only while it is still this consumer's (ARGV[2]).
pub(crate) const DELAY_SCRIPT: &str = r"
local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1)
if p[1] and p[1][2] == ARGV[2] then
  redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[3], 'IDLE', ARGV[4], 'JUSTID')
  return 1
end
return 0
";

/// Gives a fetched entry back unrun: its delivery count one less and claimable by the next
/// claim pass (idle ARGV[4] ms, `claim_idle`), only while it is still this consumer's (ARGV[2]).
pub(crate) const GIVE_BACK_SCRIPT: &str = r"
local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1)
if p[1] and p[1][2] == ARGV[2] then
  local count = tonumber(p[1][4]) - 1
  if count < 0 then count = 0 end
  redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[3], 'IDLE', ARGV[4], 'RETRYCOUNT', count, 'JUSTID')
  return 1
end
return 0
";

/// An entry's field/value pairs, in order.
pub(crate) type Fields = Vec<(Vec<u8>, Vec<u8>)>;

/// One stream entry as read: its id and its field/value pairs.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub(crate) id: String,
    pub(crate) fields: Fields,
}

impl Entry {
    pub(crate) fn field(&self, name: &[u8]) -> Option<&[u8]> {
        self.fields
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_slice())
    }
}

/// Sends `cmd` and waits at most `timeout` for the reply.
pub(crate) async fn query<C, T>(
    conn: &mut C,
    cmd: &Cmd,
    timeout: Duration,
) -> Result<T, WorkerError>
where
    C: ConnectionLike + Send,
    T: FromRedisValue,
{
    match tokio::time::timeout(timeout, cmd.query_async(conn)).await {
        Ok(result) => result.map_err(WorkerError::redis),
        Err(_) => Err(WorkerError::timeout()),
    }
}

/// `XGROUP CREATE <stream> <group> <start> MKSTREAM`; an existing group is fine.
pub(crate) async fn ensure_group<C: ConnectionLike + Send>(
    conn: &mut C,
    stream: &str,
    group: &str,
    start: &str,
    timeout: Duration,
) -> Result<(), WorkerError> {
    let mut cmd = redis::cmd("XGROUP");
    cmd.arg("CREATE")
        .arg(stream)
        .arg(group)
        .arg(start)
        .arg("MKSTREAM");
    match query::<_, Value>(conn, &cmd, timeout).await {
        Ok(_) => Ok(()),
        Err(e) if e.redis_code() == Some("BUSYGROUP") => Ok(()),
        Err(e) => Err(e),
    }
}

/// `XREADGROUP GROUP <group> <me> COUNT <n> BLOCK <ms> STREAMS <stream> >`.
pub(crate) fn read_cmd(
    stream: &str,
    group: &str,
    consumer: &str,
    count: usize,
    block: Duration,
) -> Cmd {
    let mut cmd = redis::cmd("XREADGROUP");
    cmd.arg("GROUP")
        .arg(group)
        .arg(consumer)
        .arg("COUNT")
        .arg(count)
        .arg("BLOCK")
        .arg(u64::try_from(block.as_millis()).unwrap_or(u64::MAX).max(1))
        .arg("STREAMS")
        .arg(stream)
        .arg(">");
    cmd
}

/// Parses an `XREADGROUP` reply for one stream (nil when `BLOCK` timed out).
pub(crate) fn parse_read(reply: Value) -> Result<Vec<Entry>, WorkerError> {
    let streams = match reply {
        Value::Nil => return Ok(Vec::new()),
        Value::Array(streams) => streams,
        Value::Map(pairs) => pairs
            .into_iter()
            .map(|(k, v)| Value::Array(vec![k, v]))
            .collect(),
        _ => return Err(WorkerError::reply("XREADGROUP: not an array")),
    };
    let mut entries = Vec::new();
    for stream in streams {
        let Value::Array(mut pair) = stream else {
            return Err(WorkerError::reply("XREADGROUP: stream is not a pair"));
        };
        if pair.len() != 2 {
            return Err(WorkerError::reply("XREADGROUP: stream is not a pair"));
        }
        entries.extend(parse_entries(pair.swap_remove(1))?);
    }
    Ok(entries)
}

/// Parses `[[id, [field, value, ...]], ...]`; nil entries (deleted while pending) are skipped.
pub(crate) fn parse_entries(value: Value) -> Result<Vec<Entry>, WorkerError> {
    let Value::Array(items) = value else {
        return Err(WorkerError::reply("entries: not an array"));
    };
    let mut entries = Vec::with_capacity(items.len());
    for item in items {
        let Value::Array(mut parts) = item else {
            continue;
        };
        if parts.len() != 2 {
            return Err(WorkerError::reply("entry: not [id, fields]"));
        }
        let fields = parts.pop().unwrap_or(Value::Nil);
        let id = string(parts.pop().unwrap_or(Value::Nil))?;
        let fields = match fields {
            Value::Array(flat) => pairs(flat)?,
            Value::Nil => continue,
            _ => return Err(WorkerError::reply("entry: fields are not an array")),
        };
        entries.push(Entry { id, fields });
    }
    Ok(entries)
}

fn pairs(flat: Vec<Value>) -> Result<Fields, WorkerError> {
    if !flat.len().is_multiple_of(2) {
        return Err(WorkerError::reply("entry: odd number of field values"));
    }
    let mut out = Vec::with_capacity(flat.len() / 2);
    let mut it = flat.into_iter();
    while let (Some(k), Some(v)) = (it.next(), it.next()) {
        out.push((bytes(k)?, bytes(v)?));
    }
    Ok(out)
}

pub(crate) fn bytes(value: Value) -> Result<Vec<u8>, WorkerError> {
    match value {
        Value::BulkString(b) => Ok(b),
        Value::SimpleString(s) => Ok(s.into_bytes()),
        Value::Int(i) => Ok(i.to_string().into_bytes()),
        _ => Err(WorkerError::reply("expected a string")),
    }
}

pub(crate) fn string(value: Value) -> Result<String, WorkerError> {
    String::from_utf8(bytes(value)?).map_err(|_| WorkerError::reply("expected UTF-8"))
}

/// One row of an `XINFO` reply as (field, value) pairs, from a RESP2 flat array or a RESP3 map.
pub(crate) fn info_row(row: Value) -> Result<Vec<(String, Value)>, WorkerError> {
    let pairs: Vec<(Value, Value)> = match row {
        Value::Map(pairs) => pairs,
        Value::Array(flat) => {
            let mut it = flat.into_iter();
            let mut pairs = Vec::new();
            while let (Some(k), Some(v)) = (it.next(), it.next()) {
                pairs.push((k, v));
            }
            pairs
        }
        _ => return Err(WorkerError::reply("XINFO: row is not a map")),
    };
    pairs
        .into_iter()
        .map(|(k, v)| Ok((string(k)?, v)))
        .collect()
}

/// The `lag` of `group` on `stream` (`XINFO GROUPS`): entries not yet delivered to the group.
/// `None` when Redis cannot tell (it reports nil after some deletions) or the group is absent.
pub(crate) async fn group_lag<C: ConnectionLike + Send>(
    conn: &mut C,
    stream: &str,
    group: &str,
    timeout: Duration,
) -> Result<Option<u64>, WorkerError> {
    let mut cmd = redis::cmd("XINFO");
    cmd.arg("GROUPS").arg(stream);
    let Value::Array(rows) = query::<_, Value>(conn, &cmd, timeout).await? else {
        return Err(WorkerError::reply("XINFO GROUPS: not an array"));
    };
    for row in rows {
        let fields = info_row(row)?;
        let is_ours = fields.iter().any(|(k, v)| {
            k == "name" && matches!(v, Value::BulkString(b) if b == group.as_bytes())
        });
        if is_ours {
            return Ok(fields.into_iter().find_map(|(k, v)| match (k.as_str(), v) {
                ("lag", Value::Int(n)) => u64::try_from(n).ok(),
                _ => None,
            }));
        }
    }
    Ok(None)
}

/// `XAUTOCLAIM <stream> <group> <me> <min-idle> <cursor> COUNT <n>`: (next cursor, entries).
pub(crate) fn autoclaim_cmd(
    stream: &str,
    group: &str,
    consumer: &str,
    min_idle: Duration,
    cursor: &str,
    count: usize,
) -> Cmd {
    let mut cmd = redis::cmd("XAUTOCLAIM");
    cmd.arg(stream)
        .arg(group)
        .arg(consumer)
        .arg(u64::try_from(min_idle.as_millis()).unwrap_or(u64::MAX))
        .arg(cursor)
        .arg("COUNT")
        .arg(count);
    cmd
}

pub(crate) fn parse_autoclaim(reply: Value) -> Result<(String, Vec<Entry>), WorkerError> {
    let Value::Array(mut parts) = reply else {
        return Err(WorkerError::reply("XAUTOCLAIM: not an array"));
    };
    if parts.len() < 2 {
        return Err(WorkerError::reply("XAUTOCLAIM: too short"));
    }
    // Redis 7 adds a third element: ids that were pending but deleted from the stream; Redis
    // removed them from the pending list itself, so there is nothing to do with them.
    parts.truncate(2);
    let entries = parse_entries(parts.pop().unwrap_or(Value::Nil))?;
    let cursor = string(parts.pop().unwrap_or(Value::Nil))?;
    Ok((cursor, entries))
}

/// Delivery counts of this consumer's pending entries between `first` and `last`: one
/// `XPENDING <stream> <group> <first> <last> <count> <me>` for a whole batch.
pub(crate) async fn delivery_counts<C: ConnectionLike + Send>(
    conn: &mut C,
    names: (&str, &str, &str),
    first: &str,
    last: &str,
    count: usize,
    timeout: Duration,
) -> Result<HashMap<String, u64>, WorkerError> {
    let (stream, group, consumer) = names;
    let mut cmd = redis::cmd("XPENDING");
    cmd.arg(stream)
        .arg(group)
        .arg(first)
        .arg(last)
        .arg(count)
        .arg(consumer);
    let reply: Value = query(conn, &cmd, timeout).await?;
    let Value::Array(rows) = reply else {
        return Err(WorkerError::reply("XPENDING: not an array"));
    };
    let mut counts = HashMap::with_capacity(rows.len());
    for row in rows {
        let Value::Array(mut cols) = row else {
            return Err(WorkerError::reply("XPENDING: row is not an array"));
        };
        if cols.len() != 4 {
            return Err(WorkerError::reply("XPENDING: row is not 4 columns"));
        }
        let deliveries = match cols.pop() {
            Some(Value::Int(n)) => u64::try_from(n).unwrap_or(0),
            _ => return Err(WorkerError::reply("XPENDING: count is not an integer")),
        };
        let id = string(cols.swap_remove(0))?;
        counts.insert(id, deliveries);
    }
    Ok(counts)
}

/// `XACK <stream> <group> <ids...>`.
pub(crate) fn ack_cmd(stream: &str, group: &str, ids: &[String]) -> Cmd {
    let mut cmd = redis::cmd("XACK");
    cmd.arg(stream).arg(group).arg(ids);
    cmd
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn parses_reads_and_skips_deleted_entries() {
        let reply = Value::Array(vec![Value::Array(vec![
            bulk("jobs"),
            Value::Array(vec![
                Value::Array(vec![
                    bulk("1-0"),
                    Value::Array(vec![bulk("job_id"), bulk("a")]),
                ]),
                Value::Array(vec![bulk("2-0"), Value::Nil]),
            ]),
        ])]);
        let entries = parse_read(reply).unwrap();
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0].id, "1-0");
        assert_eq!(entries[0].field(b"job_id"), Some(&b"a"[..]));
        assert!(parse_read(Value::Nil).unwrap().is_empty());
    }

    #[test]
    fn malformed_replies_are_errors_not_panics() {
        for reply in [
            Value::Int(1),
            Value::Array(vec![Value::Int(1)]),
            Value::Array(vec![Value::Array(vec![bulk("jobs")])]),
            Value::Array(vec![Value::Array(vec![
                bulk("jobs"),
                Value::Array(vec![Value::Array(vec![
                    bulk("1-0"),
                    Value::Array(vec![bulk("odd")]),
                ])]),
            ])]),
        ] {
            assert!(parse_read(reply).is_err());
        }
        assert!(parse_autoclaim(Value::Array(vec![bulk("0-0")])).is_err());
        let (cursor, entries) = parse_autoclaim(Value::Array(vec![
            bulk("0-0"),
            Value::Array(vec![]),
            Value::Array(vec![bulk("9-0")]),
        ]))
        .unwrap();
        assert_eq!((cursor.as_str(), entries.len()), ("0-0", 0));
    }
}
