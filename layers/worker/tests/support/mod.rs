//! What the worker's tests share: a connection, `XADD`, the group's pending entries, bounded
//! waits, a worker running on its own task that stops gracefully, a handler that logs its
//! calls, a connection that can lose or fail chosen commands, and (`effects`) a Postgres schema
//! for the run-once tests.
#![allow(dead_code)] // each test binary uses part of this module

pub(crate) mod effects;

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tower_once_worker::redis::aio::{ConnectionLike, ConnectionManager};
use tower_once_worker::redis::{self, RedisFuture, Value};
use tower_once_worker::{Job, JobError, RunReport, WorkerConfig};

/// How long any wait of these tests may take before it fails.
pub(crate) const LIMIT: Duration = Duration::from_secs(30);

pub(crate) async fn manager(url: &str) -> ConnectionManager {
    ConnectionManager::new(redis::Client::open(url).unwrap())
        .await
        .unwrap()
}

/// `XGROUP CREATE <stream> <group> 0 MKSTREAM`: the group reads the stream from its start.
pub(crate) async fn create_group<C: ConnectionLike + Send>(
    conn: &mut C,
    stream: &str,
    group: &str,
) {
    redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(stream)
        .arg(group)
        .arg("0")
        .arg("MKSTREAM")
        .query_async::<()>(conn)
        .await
        .unwrap();
}

pub(crate) async fn xadd<C: ConnectionLike + Send>(
    conn: &mut C,
    stream: &str,
    job_id: &str,
    payload: &str,
) -> String {
    redis::cmd("XADD")
        .arg(stream)
        .arg("*")
        .arg("job_id")
        .arg(job_id)
        .arg("payload")
        .arg(payload)
        .query_async(conn)
        .await
        .unwrap()
}

/// Entries pending in group `workers` (0 before the group exists).
pub(crate) async fn pending<C: ConnectionLike + Send>(conn: &mut C, stream: &str) -> u64 {
    let reply: Value = match redis::cmd("XPENDING")
        .arg(stream)
        .arg("workers")
        .query_async(conn)
        .await
    {
        Ok(reply) => reply,
        Err(e) if e.code() == Some("NOGROUP") => return 0,
        Err(e) => panic!("XPENDING: {e}"),
    };
    match reply {
        Value::Array(parts) => match parts.first() {
            Some(Value::Int(n)) => *n as u64,
            _ => 0,
        },
        _ => 0,
    }
}

pub(crate) async fn eventually<F: Future<Output = bool>>(what: &str, mut check: impl FnMut() -> F) {
    let started = Instant::now();
    while !check().await {
        assert!(started.elapsed() < LIMIT, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A running worker and the switch that stops it gracefully.
pub(crate) struct Running {
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<RunReport>,
}

impl Running {
    pub(crate) fn spawn<W>(run: impl FnOnce(oneshot::Receiver<()>) -> W) -> Self
    where
        W: Future<Output = RunReport> + Send + 'static,
    {
        let (stop, rx) = oneshot::channel();
        Self {
            stop: Some(stop),
            task: tokio::spawn(run(rx)),
        }
    }

    /// The worker dies: its task is dropped (no ack, no refresh).
    pub(crate) fn abort(&self) {
        self.task.abort();
    }

    pub(crate) async fn stop(mut self) -> RunReport {
        let _ = self.stop.take().unwrap().send(());
        tokio::time::timeout(LIMIT, &mut self.task)
            .await
            .unwrap()
            .unwrap()
    }
}

#[allow(unused_macros)] // not every test binary starts a worker
macro_rules! start {
    ($worker:expr) => {{
        let worker = $worker;
        $crate::support::Running::spawn(move |rx| {
            worker.run(async move {
                let _ = rx.await;
            })
        })
    }};
}

/// The owner and idle time (ms) of the first pending entry.
pub(crate) async fn first_pending<C: ConnectionLike + Send>(
    conn: &mut C,
    stream: &str,
) -> (String, i64) {
    let reply: Value = redis::cmd("XPENDING")
        .arg(stream)
        .arg("workers")
        .arg("-")
        .arg("+")
        .arg(1)
        .query_async(conn)
        .await
        .unwrap();
    let Value::Array(rows) = reply else {
        panic!("XPENDING: {reply:?}")
    };
    let Some(Value::Array(row)) = rows.first() else {
        panic!("nothing pending")
    };
    let owner = match &row[1] {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        other => panic!("owner {other:?}"),
    };
    let Value::Int(idle) = row[2] else {
        panic!("idle {:?}", row[2])
    };
    (owner, idle)
}

pub(crate) const CLAIM_IDLE: Duration = Duration::from_millis(300);

/// Calls per job id, and the deliveries each call saw.
#[derive(Clone, Default)]
pub(crate) struct Log(pub(crate) Arc<Mutex<HashMap<String, Vec<u64>>>>);

impl Log {
    pub(crate) fn record(&self, job: &Job) {
        let mut map = self.0.lock().unwrap();
        map.entry(job.job_id().to_string())
            .or_default()
            .push(job.deliveries());
    }
    pub(crate) fn calls(&self, id: &str) -> usize {
        self.0.lock().unwrap().get(id).map_or(0, Vec::len)
    }
    pub(crate) fn deliveries(&self, id: &str) -> Vec<u64> {
        self.0.lock().unwrap().get(id).cloned().unwrap_or_default()
    }
    pub(crate) fn total(&self) -> usize {
        self.0.lock().unwrap().values().map(Vec::len).sum()
    }
}

pub(crate) fn config(stream: &str, consumer: &str) -> WorkerConfig {
    WorkerConfig::new(stream, "workers")
        .consumer(consumer)
        .claim_idle(CLAIM_IDLE)
        .shutdown_grace(Duration::from_secs(10))
}

/// A handler that logs each call and behaves as `behave(job)` says.
pub(crate) fn handler(
    log: &Log,
    behave: impl Fn(&Job) -> Result<Duration, JobError> + Clone + Send + Sync + 'static,
) -> impl tower::Service<Job, Response = (), Error = JobError, Future = impl Send> + Clone + Send + 'static
{
    let log = log.clone();
    tower::service_fn(move |job: Job| {
        log.record(&job);
        let outcome = behave(&job);
        async move {
            tokio::time::sleep(outcome?).await;
            Ok(())
        }
    })
}

pub(crate) fn ok(_: &Job) -> Result<Duration, JobError> {
    Ok(Duration::ZERO)
}

/// One `XRANGE` row: the entry id and its field/value pairs.
pub(crate) type Row = (String, Vec<(Vec<u8>, Vec<u8>)>);

pub(crate) async fn xadd_fields<C: ConnectionLike + Send>(
    conn: &mut C,
    stream: &str,
    fields: &[(&[u8], &[u8])],
) -> String {
    let mut cmd = redis::cmd("XADD");
    cmd.arg(stream).arg("*");
    for (k, v) in fields {
        cmd.arg(*k).arg(*v);
    }
    cmd.query_async(conn).await.unwrap()
}

/// The dead letters of `stream` as field maps (values lossily decoded).
pub(crate) async fn dead_letters<C: ConnectionLike + Send>(
    conn: &mut C,
    stream: &str,
) -> Vec<HashMap<String, String>> {
    let rows: Vec<Row> = redis::cmd("XRANGE")
        .arg(format!("{stream}:dead"))
        .arg("-")
        .arg("+")
        .query_async(conn)
        .await
        .unwrap();
    rows.into_iter()
        .map(|(_, fields)| {
            fields
                .into_iter()
                .map(|(k, v)| {
                    let v = if v.len() > 64 {
                        format!("<{} bytes>", v.len())
                    } else {
                        String::from_utf8_lossy(&v).into_owned()
                    };
                    (String::from_utf8_lossy(&k).into_owned(), v)
                })
                .collect()
        })
        .collect()
}

/// A connection that passes everything through to Redis, except that, while `lose` is set,
/// the reply to one command whose name contains `lose_reply_of` is lost on the way back
/// (Redis executed it; the client never hears back, like a response timeout during a network
/// blip or a Redis stall). `before` runs a command through the same connection just before
/// the first command whose name contains `before_cmd` (to interleave a concurrent client).
#[derive(Clone)]
pub(crate) struct Tap {
    pub(crate) inner: ConnectionManager,
    pub(crate) lose_reply_of: &'static str,
    pub(crate) lose: Arc<AtomicBool>,
    pub(crate) before_cmd: &'static str,
    pub(crate) before: Arc<Mutex<Option<redis::Cmd>>>,
    pub(crate) fail_cmds: &'static [&'static str],
}

impl Tap {
    pub(crate) fn new(inner: ConnectionManager) -> Self {
        Self {
            inner,
            lose_reply_of: "",
            lose: Arc::new(AtomicBool::new(false)),
            before_cmd: "",
            before: Arc::new(Mutex::new(None)),
            fail_cmds: &[],
        }
    }
}

fn cmd_name(cmd: &redis::Cmd) -> String {
    match cmd.args_iter().next() {
        Some(redis::Arg::Simple(b)) => String::from_utf8_lossy(b).to_uppercase(),
        _ => String::new(),
    }
}

impl ConnectionLike for Tap {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let name = cmd_name(cmd);
            if self.fail_cmds.contains(&name.as_str()) {
                return Err(redis::RedisError::from((
                    redis::ErrorKind::Io,
                    "injected failure",
                )));
            }
            if !self.before_cmd.is_empty() && name == self.before_cmd {
                let first = self.before.lock().unwrap().take();
                if let Some(first) = first {
                    first.query_async::<Value>(&mut self.inner).await?;
                }
            }
            let reply = self.inner.req_packed_command(cmd).await?;
            let has_entries = !matches!(reply, Value::Nil);
            if !self.lose_reply_of.is_empty()
                && name == self.lose_reply_of
                && has_entries
                && self.lose.swap(false, Ordering::SeqCst)
            {
                // The reply never arrives.
                std::future::pending::<()>().await;
            }
            Ok(reply)
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        self.inner.req_packed_commands(pipeline, offset, count)
    }

    fn get_db(&self) -> i64 {
        self.inner.get_db()
    }
}

#[allow(unused_imports)]
pub(crate) use start;
