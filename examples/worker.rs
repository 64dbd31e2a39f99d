//! A Redis Streams worker process, as the black-box tests drive it.
//!
//! ```sh
//! redis-server --port 6379 --save '' --appendonly no &
//! cargo run --example worker --features worker -- --redis redis://127.0.0.1:6379
//! # elsewhere:
//! redis-cli XADD jobs '*' job_id order-1 payload '{"action":"ok"}'
//! redis-cli XADD jobs '*' job_id order-2 payload '{"action":"fail"}'            # redelivered, then dead-lettered
//! redis-cli XADD jobs '*' job_id order-3 payload '{"action":"fail_permanent"}'  # dead-lettered at once
//! redis-cli XADD jobs '*' job_id order-4 payload '{"action":"sleep","ms":2000}'
//! redis-cli XRANGE jobs:dead - +
//! ```
//!
//! Options: `--redis URL` (required), `--stream jobs`, `--group workers`, `--consumer NAME`
//! (default `<hostname>-<pid>`), `--claim-idle-ms 30000`, `--max-deliveries 5`,
//! `--concurrency 16`, `--shutdown-grace-ms 30000`, `--run-once` (skip job ids whose effect
//! is done, on a `RedisStore` in the same Redis). Runs until SIGTERM or SIGINT, then shuts
//! down gracefully (in-flight jobs get the grace period) and exits 0.
//!
//! The handler reads `payload` = `{"action": "ok" | "fail" | "fail_permanent" | "sleep",
//! "ms": N}`: it does `INCR runs:<job_id>` when it starts and `INCR effects:<job_id>` when it
//! succeeds. A payload that is not such JSON is a permanent failure. For tests, it also sets
//! `deliveries:<job_id>` to the delivery count on every delivery, and a payload field
//! `"linger_ms": N` makes it wait N ms after a successful run before returning (the window
//! between the effect and `XACK` in which a test kills the process).

use serde::Deserialize;
use std::time::Duration;
use tower::util::BoxCloneService;
use tower::{Layer, Service, ServiceExt};
use tower_once::idempotency::store::redis::RedisStore;
use tower_once::worker::redis::aio::ConnectionManager;
use tower_once::worker::{BoxError, Job, JobError, RunOnceLayer, Worker, WorkerConfig};

struct Args {
    redis: String,
    stream: String,
    group: String,
    consumer: Option<String>,
    claim_idle: Duration,
    max_deliveries: u64,
    concurrency: usize,
    shutdown_grace: Duration,
    run_once: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        redis: String::new(),
        stream: "jobs".into(),
        group: "workers".into(),
        consumer: None,
        claim_idle: Duration::from_millis(30_000),
        max_deliveries: 5,
        concurrency: 16,
        shutdown_grace: Duration::from_millis(30_000),
        run_once: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--run-once" {
            args.run_once = true;
            continue;
        }
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        let number = |v: &str| {
            v.parse::<u64>()
                .map_err(|_| format!("{flag}: not a number: {v}"))
        };
        match flag.as_str() {
            "--redis" => args.redis = value,
            "--stream" => args.stream = value,
            "--group" => args.group = value,
            "--consumer" => args.consumer = Some(value),
            "--claim-idle-ms" => args.claim_idle = Duration::from_millis(number(&value)?),
            "--max-deliveries" => args.max_deliveries = number(&value)?,
            "--shutdown-grace-ms" => args.shutdown_grace = Duration::from_millis(number(&value)?),
            "--concurrency" => {
                args.concurrency = usize::try_from(number(&value)?).map_err(|e| e.to_string())?
            }
            _ => return Err(format!("unknown option {flag}")),
        }
    }
    if args.redis.is_empty() {
        return Err("--redis URL is required".into());
    }
    Ok(args)
}

#[derive(Deserialize)]
struct Payload {
    action: String,
    #[serde(default)]
    ms: u64,
    #[serde(default)]
    linger_ms: u64,
}

async fn redis(
    conn: &ConnectionManager,
    cmd: &str,
    key: String,
    arg: Option<u64>,
) -> Result<(), JobError> {
    let mut c = tower_once::worker::redis::cmd(cmd);
    c.arg(key);
    if let Some(arg) = arg {
        c.arg(arg);
    }
    c.query_async::<()>(&mut conn.clone())
        .await
        .map_err(JobError::transient)
}

/// The job itself: count the start, act on the payload, count the effect.
async fn handle(conn: ConnectionManager, job: Job) -> Result<(), JobError> {
    let id = job.job_id().as_str();
    redis(&conn, "INCR", format!("runs:{id}"), None).await?;
    let payload: Payload = serde_json::from_slice(job.payload()).map_err(JobError::permanent)?;
    match payload.action.as_str() {
        "ok" => {}
        "sleep" => tokio::time::sleep(Duration::from_millis(payload.ms)).await,
        "fail" => return Err(JobError::transient("the payload asked to fail")),
        "fail_permanent" => {
            return Err(JobError::permanent("the payload asked to fail permanently"))
        }
        other => return Err(JobError::permanent(format!("unknown action {other:?}"))),
    }
    redis(&conn, "INCR", format!("effects:{id}"), None).await
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    tracing_subscriber::fmt()
        .with_env_filter(
            // Debug for the worker: one line per delivery, with its outcome.
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,tower_once_worker=debug".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    // Installed now, before anything says the worker is up, so an early SIGTERM is not missed.
    let signal = tower_once::shutdown_signal();
    let args = parse_args().map_err(|e| format!("{e}\nusage: worker --redis URL [--stream jobs] [--group workers] [--consumer NAME] [--claim-idle-ms 30000] [--max-deliveries 5] [--concurrency 16] [--shutdown-grace-ms 30000] [--run-once]"))?;

    let client = tower_once::worker::redis::Client::open(args.redis.as_str())?;
    let conn = ConnectionManager::new_lazy_with_config(client, Default::default())?;
    let base = {
        let conn = conn.clone();
        tower::service_fn(move |job: Job| handle(conn.clone(), job))
    };
    let handler: BoxCloneService<Job, (), BoxError> = if args.run_once {
        let store = RedisStore::connect(&args.redis).await?;
        // Half of claim_idle: a crashed delivery's claim has expired by the time its entry is
        // taken over, so the takeover (delivery 2) runs it instead of finding it in progress.
        let run_once = RunOnceLayer::new(store)
            .lease(args.claim_idle / 2)
            .layer(base);
        BoxCloneService::new(
            run_once
                .map_response(|outcome| {
                    tracing::info!(outcome = outcome.as_str(), "run-once");
                })
                .map_err(BoxError::from),
        )
    } else {
        BoxCloneService::new(base.map_err(BoxError::from))
    };
    // Outermost: the test hooks (record the delivery count; linger between effect and XACK).
    let service = tower::service_fn(move |job: Job| {
        let mut inner = handler.clone();
        let conn = conn.clone();
        async move {
            let key = format!("deliveries:{}", job.job_id());
            let _ = redis(&conn, "SET", key, Some(job.deliveries())).await;
            let linger =
                serde_json::from_slice::<Payload>(job.payload()).map_or(0, |p| p.linger_ms);
            inner.ready().await?.call(job).await?;
            tokio::time::sleep(Duration::from_millis(linger)).await;
            Ok::<_, BoxError>(())
        }
    });

    let mut config = WorkerConfig::new(args.stream, args.group)
        .claim_idle(args.claim_idle)
        .max_deliveries(args.max_deliveries)
        .concurrency(args.concurrency)
        .shutdown_grace(args.shutdown_grace);
    if let Some(consumer) = args.consumer {
        config = config.consumer(consumer);
    }
    tracing::info!(
        consumer = config.consumer_name(),
        stream = config.stream_name(),
        "worker starting"
    );
    let worker = Worker::connect(&args.redis, config, service)?;
    let shutdown = async move {
        signal.await;
        tracing::info!("shutting down: finishing in-flight jobs");
    };
    let report = worker.run(shutdown).await;
    tracing::info!(?report, "worker stopped");
    Ok(())
}
