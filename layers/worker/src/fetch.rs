//! Where the next entries come from: idle entries to take over, else new ones.

use crate::consume::Ctx;
use crate::error::WorkerError;
use crate::streams::{self, Entry};
use redis::aio::ConnectionLike;
use redis::Value;
use std::cmp::Reverse;
use std::sync::PoisonError;
use std::time::Duration;
use tokio::time::Instant;
use tower_once_core::outage::Outage;

/// Where the next entries come from: idle entries to take over (`XAUTOCLAIM`, its cursor kept
/// between calls), else new ones (`XREADGROUP`).
pub(crate) struct Fetch<Conn> {
    reader: Conn,
    cursor: String,
    next_claim: Instant,
    group_ready: bool,
    outage: Outage,
}

impl<Conn> Fetch<Conn> {
    pub(crate) fn new(reader: Conn) -> Self {
        Self {
            reader,
            cursor: "0-0".to_owned(),
            next_claim: Instant::now(),
            group_ready: false,
            outage: Outage::default(),
        }
    }

    pub(crate) fn succeeded(&mut self) {
        if let Some(failures) = self.outage.recovered() {
            tracing::info!(failures, "redis reachable again");
        }
    }

    /// Logs (without flooding the log: see [`Outage`]) and returns how long to back off.
    pub(crate) fn failed(&mut self, e: &WorkerError) -> Duration {
        let wait = self.outage.failed();
        if e.redis_code() == Some("NOGROUP") {
            // Redis lost the group (a restart without persistence): create it again.
            self.group_ready = false;
        }
        let failures = self.outage.failures();
        if self.outage.should_warn() {
            tracing::warn!(error = %e, failures, "worker cannot reach redis; retrying");
        } else {
            tracing::debug!(error = %e, failures, "worker cannot reach redis; retrying");
        }
        wait
    }
}

impl<Conn: ConnectionLike + Clone + Send> Fetch<Conn> {
    pub(crate) async fn next<C>(
        &mut self,
        ctx: &Ctx<C, Conn>,
        free: usize,
    ) -> Result<Vec<(Entry, u64)>, WorkerError> {
        let c = &ctx.config;
        let mut conn = ctx.conn.clone();
        if !self.group_ready {
            streams::ensure_group(
                &mut conn,
                &c.stream,
                &c.group,
                &c.group_start,
                c.command_timeout,
            )
            .await?;
            self.group_ready = true;
        }
        let count = free.min(c.batch_size);
        let now = Instant::now();
        let next_early = {
            // Handlers asked for earlier redeliveries: take over then, not at the next pass.
            let mut times = ctx.claim_at.lock().unwrap_or_else(PoisonError::into_inner);
            while times.peek().is_some_and(|Reverse(at)| *at <= now) {
                times.pop();
                self.next_claim = now;
            }
            times.peek().map(|Reverse(at)| *at)
        };
        if let Some(at) = next_early {
            self.next_claim = self.next_claim.min(at);
        }
        if now >= self.next_claim {
            let claimed = self.take_over(ctx, &mut conn, count).await?;
            if !claimed.is_empty() {
                self.succeeded();
                return Ok(claimed);
            }
        }
        // A read must not outlast the next early take-over it knows of.
        let block = next_early.map_or(c.effective_block(), |at| {
            c.effective_block()
                .min(at.saturating_duration_since(now))
                .max(Duration::from_millis(1))
        });
        let read = streams::read_cmd(&c.stream, &c.group, &c.consumer, count, block);
        let reply: Value =
            streams::query(&mut self.reader, &read, block + c.command_timeout).await?;
        self.succeeded();
        // `>` hands out entries never delivered before: their delivery count is 1.
        Ok(streams::parse_read(reply)?
            .into_iter()
            .map(|e| (e, 1))
            .collect())
    }

    async fn take_over<C>(
        &mut self,
        ctx: &Ctx<C, Conn>,
        conn: &mut Conn,
        count: usize,
    ) -> Result<Vec<(Entry, u64)>, WorkerError> {
        let c = &ctx.config;
        let cmd = streams::autoclaim_cmd(
            &c.stream,
            &c.group,
            &c.consumer,
            c.claim_idle,
            &self.cursor,
            count,
        );
        let (cursor, entries) =
            streams::parse_autoclaim(streams::query(conn, &cmd, c.command_timeout).await?)?;
        if cursor == "0-0" {
            // A full pass: look again in half a claim_idle. Otherwise continue right away.
            self.next_claim = Instant::now() + c.claim_interval();
        }
        self.cursor = cursor;
        let (Some(first), Some(last)) = (entries.first(), entries.last()) else {
            return Ok(Vec::new());
        };
        // One XPENDING for the batch. The range may also hold other entries pending here
        // (running, or left pending and not idle yet): ask for enough rows to cover the
        // running ones, and look up singly what a longer list pushed out of the reply.
        let names = (c.stream.as_str(), c.group.as_str(), c.consumer.as_str());
        let rows = entries.len() + c.concurrency;
        let timeout = c.command_timeout;
        let mut counts =
            streams::delivery_counts(conn, names, &first.id, &last.id, rows, timeout).await?;
        if counts.len() >= rows {
            for entry in &entries {
                if !counts.contains_key(&entry.id) {
                    let one =
                        streams::delivery_counts(conn, names, &entry.id, &entry.id, 1, timeout)
                            .await?;
                    counts.extend(one);
                }
            }
        }
        // An entry missing from our pending list was acknowledged meanwhile by its previous
        // owner (a slow worker finishing after all): it is done, skip it.
        // NOTE: an entry this worker is running itself (its claim refresh failed, so it looked
        // idle) is ours already: running it again would call the handler twice at once.
        let running = ctx
            .in_flight
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        Ok(entries
            .into_iter()
            .filter(|e| !running.contains(&e.id))
            .filter_map(|e| counts.get(&e.id).copied().map(|n| (e, n)))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server_error(code: &str) -> WorkerError {
        let parsed = redis::parse_redis_value(format!("-{code} details\r\n").as_bytes());
        match parsed.and_then(redis::Value::extract_error) {
            Err(e) => WorkerError::redis(e),
            Ok(v) => panic!("not an error: {v:?}"),
        }
    }

    #[test]
    fn backoff_doubles_to_a_cap_and_nogroup_recreates_the_group() {
        let mut fetch = Fetch::new(());
        fetch.group_ready = true;
        let pauses: Vec<u128> = (0..9)
            .map(|_| fetch.failed(&WorkerError::timeout()).as_millis())
            .collect();
        assert_eq!(pauses, [100, 200, 400, 800, 1600, 3200, 5000, 5000, 5000]);
        assert!(fetch.group_ready, "a timeout says nothing about the group");
        assert_eq!(server_error("NOGROUP").redis_code(), Some("NOGROUP"));
        fetch.failed(&server_error("NOGROUP"));
        assert!(!fetch.group_ready);
        fetch.succeeded();
        assert_eq!(
            fetch.failed(&WorkerError::timeout()),
            Duration::from_millis(100)
        );
    }
}
