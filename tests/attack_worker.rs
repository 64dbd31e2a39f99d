//! Attacks on `tower-once-worker` against real `redis-server` processes. A FAILING test here
//! demonstrates a broken guarantee; passing ones are marked HOLDS.
#![cfg(feature = "worker")]

mod support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::worker::{eventually, manager, pending, start, xadd};
use tower::{Layer, ServiceExt};
use tower_once::idempotency::store::MemoryStore;
use tower_once::worker::redis::aio::{ConnectionLike, ConnectionManager};
use tower_once::worker::redis::{self, RedisFuture, Value};
use tower_once::worker::{Job, JobError, Producer, RunOnceLayer, Worker, WorkerConfig};
use tower_once_test_support::redis::RedisServer;

/// One `XRANGE` row: the entry id and its field/value pairs.
type Row = (String, Vec<(Vec<u8>, Vec<u8>)>);

const CLAIM_IDLE: Duration = Duration::from_millis(300);

#[derive(Clone, Default)]
struct Log(Arc<Mutex<HashMap<String, Vec<u64>>>>);

impl Log {
    fn record(&self, job: &Job) {
        self.0
            .lock()
            .unwrap()
            .entry(job.job_id().to_string())
            .or_default()
            .push(job.deliveries());
    }
    fn calls(&self, id: &str) -> usize {
        self.0.lock().unwrap().get(id).map_or(0, Vec::len)
    }
    fn total(&self) -> usize {
        self.0.lock().unwrap().values().map(Vec::len).sum()
    }
}

fn config(stream: &str, consumer: &str) -> WorkerConfig {
    WorkerConfig::new(stream, "workers")
        .consumer(consumer)
        .claim_idle(CLAIM_IDLE)
        .shutdown_grace(Duration::from_secs(10))
}

async fn xadd_fields<C: ConnectionLike + Send>(
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
async fn dead_letters<C: ConnectionLike + Send>(
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

fn handler(
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

/// A connection that passes everything through to Redis, except that, while `lose` is set,
/// the reply to one command whose name contains `lose_reply_of` is lost on the way back
/// (Redis executed it; the client never hears back, like a response timeout during a network
/// blip or a Redis stall). `before` runs a command through the same connection just before
/// the first command whose name contains `before_cmd` (to interleave a concurrent client).
#[derive(Clone)]
struct Tap {
    inner: ConnectionManager,
    lose_reply_of: &'static str,
    lose: Arc<AtomicBool>,
    before_cmd: &'static str,
    before: Arc<Mutex<Option<redis::Cmd>>>,
    fail_cmds: &'static [&'static str],
}

impl Tap {
    fn new(inner: ConnectionManager) -> Self {
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

/// Was a break found by the attack, now fixed (the claim names its stream entry, so another
/// entry with the same job id is acknowledged as a duplicate). Issue 11: "a concurrent second
/// delivery waits or is acknowledged as duplicate".
/// The same job id enqueued twice while the first run takes longer than
/// `claim_idle * max_deliveries`: each delivery of the duplicate finds the run-once claim in
/// progress, is classified transient and left pending, burns a delivery, and the duplicate is
/// finally dead-lettered (`max_deliveries`) — a dead letter for a job whose effect succeeded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_enqueued_during_a_long_run_is_acked_as_duplicate() {
    let server = RedisServer::start();
    let mut conn = manager(&server.url()).await;
    let log = Log::default();
    let effects = Arc::new(AtomicUsize::new(0));
    let done = effects.clone();
    let inner = handler(&log, |_| Ok(Duration::from_secs(3))).map_response(move |()| {
        done.fetch_add(1, Ordering::SeqCst);
    });
    let svc = RunOnceLayer::new(MemoryStore::new())
        .lease(CLAIM_IDLE / 2)
        .layer(inner);
    xadd(&mut conn, "dup", "order-1", "{}").await;
    xadd(&mut conn, "dup", "order-1", "{}").await;
    let worker = start!(Worker::connect(
        &server.url(),
        config("dup", "w").concurrency(4).max_deliveries(2),
        svc
    )
    .unwrap());
    eventually("the effect", || async {
        effects.load(Ordering::SeqCst) == 1
    })
    .await;
    eventually("nothing pending", || {
        let mut conn = conn.clone();
        async move { pending(&mut conn, "dup").await == 0 }
    })
    .await;
    let report = worker.stop().await;
    assert_eq!(log.calls("order-1"), 1, "one run (holds)");
    let dead = dead_letters(&mut conn, "dup").await;
    assert!(
        dead.is_empty(),
        "the duplicate of a job that succeeded was dead-lettered: {dead:?}; report {report:?}"
    );
}

/// A known limit found by the attack (ignored; in the worker docs). Issue 11: "an always-failing transient handler with max_deliveries = 3 runs exactly
/// 3 times, and the 4th claim dead-letters it". When the reply to the `XREADGROUP` that handed
/// out the entry is lost (Redis executed it; the client timed out), the entry sits in this
/// consumer's pending list with delivery count 1 and the handler never saw it; the takeover
/// counts 2. The handler then runs only twice before the entry is dead-lettered with
/// `deliveries` 4. (With `max_deliveries = 1` the job is dead-lettered without ever running.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "known limit (worker docs): a delivery whose XREADGROUP reply was lost still counts toward max_deliveries"]
async fn a_lost_xreadgroup_reply_costs_a_delivery_the_handler_never_saw() {
    let server = RedisServer::start();
    let mut conn = manager(&server.url()).await;
    let log = Log::default();
    let svc = handler(&log, |_| Err(JobError::transient("always fails")));
    let mut reader = Tap::new(manager(&server.url()).await);
    reader.lose_reply_of = "XREADGROUP";
    reader.lose.store(true, Ordering::SeqCst);
    let writer = Tap::new(manager(&server.url()).await);
    let cfg = config("lost", "w")
        .max_deliveries(3)
        .command_timeout(Duration::from_millis(500));
    xadd(&mut conn, "lost", "poison-1", "{}").await;
    let worker = start!(Worker::new(cfg, reader, writer, svc).unwrap());
    eventually("dead-lettered", || {
        let mut conn = conn.clone();
        async move { !dead_letters(&mut conn, "lost").await.is_empty() }
    })
    .await;
    worker.stop().await;
    let dead = dead_letters(&mut conn, "lost").await;
    assert_eq!(
        log.calls("poison-1"),
        3,
        "max_deliveries = 3 must mean 3 runs; dead letter: {dead:?}"
    );
}

/// Was a break found by the attack, now fixed. `Producer::trim_acknowledged` read
/// `XINFO GROUPS`, then sent `XTRIM MINID` as a separate command: a worker of a new group
/// starting in between (`XGROUP CREATE <stream> <group> 0 MKSTREAM`, what `Worker::run` does
/// with the default `group_start` `0`) had every entry it should get trimmed away. The trim is
/// now one script: a group created right before it (the last moment the old race allowed) is
/// seen by it, and none can be created in the middle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trimming_sees_a_group_created_just_before_it() {
    let server = RedisServer::start();
    let mut conn = manager(&server.url()).await;
    // Group "workers" has read and acknowledged three entries.
    let _: Value = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg("trim")
        .arg("workers")
        .arg("0")
        .arg("MKSTREAM")
        .query_async(&mut conn)
        .await
        .unwrap();
    let mut ids = Vec::new();
    for i in 0..3 {
        ids.push(xadd(&mut conn, "trim", &format!("job-{i}"), "{}").await);
    }
    let _: Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg("workers")
        .arg("c")
        .arg("STREAMS")
        .arg("trim")
        .arg(">")
        .query_async(&mut conn)
        .await
        .unwrap();
    let _: Value = redis::cmd("XACK")
        .arg("trim")
        .arg("workers")
        .arg(&ids)
        .query_async(&mut conn)
        .await
        .unwrap();
    // A new worker group ("mailers") starts between the trim's XINFO GROUPS and its XTRIM.
    let mut tap = Tap::new(manager(&server.url()).await);
    let mut create = redis::cmd("XGROUP");
    create
        .arg("CREATE")
        .arg("trim")
        .arg("mailers")
        .arg("0")
        .arg("MKSTREAM");
    tap.before_cmd = "EVALSHA";
    *tap.before.lock().unwrap() = Some(create);
    let trimmed = Producer::new(tap, "trim")
        .trim_acknowledged()
        .await
        .unwrap();
    let read: Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg("mailers")
        .arg("m")
        .arg("STREAMS")
        .arg("trim")
        .arg(">")
        .query_async(&mut conn)
        .await
        .unwrap();
    let got = match read {
        Value::Array(streams) => match streams.into_iter().next() {
            Some(Value::Array(mut pair)) if pair.len() == 2 => match pair.pop() {
                Some(Value::Array(entries)) => entries.len(),
                _ => 0,
            },
            _ => 0,
        },
        _ => 0,
    };
    assert_eq!(
        got, 3,
        "group \"mailers\" (created at 0) lost entries it never saw; trim deleted {trimmed}"
    );
}

/// HOLDS. Poison entries — no job_id, an empty, non-ASCII, non-UTF-8 or 256-byte job_id, odd
/// field names, a duplicated job_id field, a non-UTF-8 payload, a 6 MiB payload — and an entry
/// deleted (`XDEL`) while pending in a dead consumer: each valid job runs once, each malformed
/// one is dead-lettered unrun, nothing stays pending and the worker keeps going.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_entries_are_dead_lettered_unrun_and_nothing_sticks() {
    let server = RedisServer::start();
    let mut conn = manager(&server.url()).await;
    let log = Log::default();
    let seen_payload = Arc::new(Mutex::new(HashMap::<String, usize>::new()));
    let seen = seen_payload.clone();
    let svc = handler(&log, move |job| {
        seen.lock()
            .unwrap()
            .insert(job.job_id().to_string(), job.payload().len());
        Ok(Duration::ZERO)
    });
    // An entry pending in a consumer that died, then deleted from the stream.
    let _: Value = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg("poison")
        .arg("workers")
        .arg("0")
        .arg("MKSTREAM")
        .query_async(&mut conn)
        .await
        .unwrap();
    let ghost = xadd(&mut conn, "poison", "ghost-1", "{}").await;
    let _: Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg("workers")
        .arg("dead-consumer")
        .arg("STREAMS")
        .arg("poison")
        .arg(">")
        .query_async(&mut conn)
        .await
        .unwrap();
    let _: Value = redis::cmd("XDEL")
        .arg("poison")
        .arg(&ghost)
        .query_async(&mut conn)
        .await
        .unwrap();
    let huge = vec![b'x'; 6 << 20];
    let long_id = "i".repeat(256);
    let malformed: Vec<Vec<(&[u8], &[u8])>> = vec![
        vec![(b"payload", b"{}")],
        vec![(b"job_id", b""), (b"payload", b"{}")],
        vec![(b"job_id", "é".as_bytes())],
        vec![(b"job_id", b"\xff\xfe"), (b"payload", b"{}")],
        vec![(b"job_id", long_id.as_bytes())],
        vec![(b"job_id", b"has space")],
        vec![(b"\xff\x00", b"job_id"), (b"", b"")],
    ];
    for fields in &malformed {
        xadd_fields(&mut conn, "poison", fields).await;
    }
    xadd_fields(
        &mut conn,
        "poison",
        &[
            (b"job_id", b"dup-field"),
            (b"job_id", b"second"),
            (b"payload", b"p"),
        ],
    )
    .await;
    xadd_fields(
        &mut conn,
        "poison",
        &[(b"job_id", b"binary"), (b"payload", b"\xff\x00\xfe")],
    )
    .await;
    xadd_fields(
        &mut conn,
        "poison",
        &[(b"job_id", b"huge"), (b"payload", &huge)],
    )
    .await;
    let n_malformed = malformed.len();
    let worker = start!(Worker::connect(&server.url(), config("poison", "w"), svc).unwrap());
    eventually("all handled", || {
        let mut conn = conn.clone();
        async move {
            pending(&mut conn, "poison").await == 0
                && dead_letters(&mut conn, "poison").await.len() >= n_malformed
        }
    })
    .await;
    // The worker is still alive: a later job runs.
    xadd(&mut conn, "poison", "after", "{}").await;
    eventually("a later job", || async { log.calls("after") == 1 }).await;
    worker.stop().await;
    let dead = dead_letters(&mut conn, "poison").await;
    assert_eq!(dead.len(), malformed.len(), "{dead:?}");
    assert!(
        dead.iter()
            .all(|d| d.get("reason").map(String::as_str) == Some("malformed")),
        "{dead:?}"
    );
    assert_eq!(log.calls("dup-field"), 1);
    assert_eq!(log.calls("binary"), 1);
    assert_eq!(log.calls("huge"), 1);
    assert_eq!(seen_payload.lock().unwrap().get("huge"), Some(&(6 << 20)));
    assert_eq!(log.calls("ghost-1"), 0, "a deleted entry is not run");
    assert_eq!(log.total(), 4, "only the valid jobs ran");
    assert_eq!(pending(&mut conn, "poison").await, 0);
}

/// Was a break found by the attack, now fixed. A worker never hands itself a job it is running: `take_over` did not skip the
/// entries in its own in-flight set. When the refresh cannot reach Redis for a while (here the
/// script calls fail, as with a command timeout, a Redis that refuses `EVALSHA`, or a scripting
/// ACL), the worker's own `XAUTOCLAIM` takes over the entry it is still running and calls the
/// handler again, concurrently, in the same process (then dead-letters it as `max_deliveries`
/// while the first call is still running). Run-once aside, the worker knows the entry is in
/// flight here and could skip it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_never_takes_over_its_own_running_entry_when_a_refresh_fails() {
    let server = RedisServer::start();
    let mut conn = manager(&server.url()).await;
    let log = Log::default();
    let svc = handler(&log, |_| Ok(Duration::from_millis(1500)));
    let reader = Tap::new(manager(&server.url()).await);
    let mut writer = Tap::new(manager(&server.url()).await);
    writer.fail_cmds = &["EVALSHA", "EVAL", "SCRIPT"];
    xadd(&mut conn, "self", "slow-1", "{}").await;
    let worker =
        start!(Worker::new(config("self", "w").max_deliveries(3), reader, writer, svc).unwrap());
    eventually("finished", || {
        let mut conn = conn.clone();
        async move { pending(&mut conn, "self").await == 0 }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1600)).await;
    worker.stop().await;
    let dead = dead_letters(&mut conn, "self").await;
    assert_eq!(
        log.calls("slow-1"),
        1,
        "one process ran its own entry {} times (deliveries seen {:?}); dead letters {dead:?}",
        log.calls("slow-1"),
        log.0.lock().unwrap().get("slow-1")
    );
}
