//! Helpers for the worker's tests: a connection, `XADD`, the group's pending entries, bounded
//! waits, and a worker running on its own task that stops gracefully.

use std::future::Future;
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tower_once::worker::redis::aio::{ConnectionLike, ConnectionManager};
use tower_once::worker::redis::{self, Value};
use tower_once::worker::RunReport;

/// How long any wait of these tests may take before it fails.
pub(crate) const LIMIT: Duration = Duration::from_secs(30);

pub(crate) async fn manager(url: &str) -> ConnectionManager {
    ConnectionManager::new(redis::Client::open(url).unwrap())
        .await
        .unwrap()
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
        $crate::support::worker::Running::spawn(move |rx| {
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

#[allow(unused_imports)]
pub(crate) use start;
