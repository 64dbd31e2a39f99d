//! Jobs per second through the worker, end to end (read → handler → ack), at 1, 16 and 64 jobs
//! in flight, beside a plain `redis`-crate `XREADGROUP`/`XACK` loop on the same Redis in the
//! same run, and the Redis commands each spends per job (from `INFO commandstats`).
//!
//! Each round fills a fresh stream with `JOBS` entries (pipelined `XADD`, not timed), then
//! times how long a consumer takes to run a no-op handler on every one and acknowledge it.
//! Starts its own `redis-server` on a free loopback port. Each figure is the median of the
//! interleaved rounds; the last column divides a consumer's median rate by the plain loop's.
//!
//! ```sh
//! cargo bench --bench worker --features worker
//! ```
#![allow(missing_docs)]

#[path = "support/report.rs"]
mod report;

use report::{median, Table};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;
use tower_once::worker::redis::aio::ConnectionManager;
use tower_once::worker::redis::{self, Value};
use tower_once::worker::{Job, JobError, Worker, WorkerConfig};
use tower_once_test_support::redis::RedisServer;

const JOBS: u64 = 20_000;

async fn fill(conn: &mut ConnectionManager, stream: &str) {
    redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(stream)
        .arg("g")
        .arg("0")
        .arg("MKSTREAM")
        .query_async::<()>(conn)
        .await
        .expect("XGROUP");
    for chunk in 0..JOBS / 1000 {
        let mut pipe = redis::pipe();
        for i in 0..1000 {
            pipe.cmd("XADD")
                .arg(stream)
                .arg("*")
                .arg("job_id")
                .arg(format!("j{}", chunk * 1000 + i))
                .arg("payload")
                .arg("{}")
                .ignore();
        }
        pipe.query_async::<()>(conn).await.expect("XADD");
    }
}

fn commands(server: &RedisServer) -> u64 {
    server.command_calls().iter().map(|(_, n)| n).sum()
}

/// The baseline: read up to `in_flight` entries, run the handler on each concurrently, then
/// acknowledge the batch with one `XACK`.
async fn plain_loop(conn: &mut ConnectionManager, stream: &str, in_flight: usize) {
    let mut done = 0;
    while done < JOBS {
        let reply: Value = redis::cmd("XREADGROUP")
            .arg("GROUP")
            .arg("g")
            .arg("plain")
            .arg("COUNT")
            .arg(in_flight)
            .arg("BLOCK")
            .arg(100)
            .arg("STREAMS")
            .arg(stream)
            .arg(">")
            .query_async(conn)
            .await
            .expect("XREADGROUP");
        let ids = entry_ids(reply);
        let handlers: Vec<_> = ids
            .iter()
            .map(|_| tokio::spawn(async { tokio::task::yield_now().await }))
            .collect();
        for h in handlers {
            h.await.expect("handler");
        }
        redis::cmd("XACK")
            .arg(stream)
            .arg("g")
            .arg(&ids)
            .query_async::<()>(conn)
            .await
            .expect("XACK");
        done += ids.len() as u64;
    }
}

fn entry_ids(reply: Value) -> Vec<String> {
    let Value::Array(streams) = reply else {
        return Vec::new();
    };
    let mut ids = Vec::new();
    for s in streams {
        let Value::Array(mut pair) = s else { continue };
        let Some(Value::Array(entries)) = pair.pop() else {
            continue;
        };
        for e in entries {
            if let Value::Array(parts) = e {
                if let Some(Value::BulkString(id)) = parts.into_iter().next() {
                    ids.push(String::from_utf8_lossy(&id).into_owned());
                }
            }
        }
    }
    ids
}

async fn worker_run(url: &str, stream: &str, in_flight: usize) {
    let handled = Arc::new(AtomicU64::new(0));
    let all_done = Arc::new(tokio::sync::Notify::new());
    let (count, done) = (handled.clone(), all_done.clone());
    let svc = tower::service_fn(move |_job: Job| {
        if count.fetch_add(1, Relaxed) + 1 == JOBS {
            done.notify_one();
        }
        async {
            tokio::task::yield_now().await;
            Ok::<_, JobError>(())
        }
    });
    // A short BLOCK: shutdown lets the read in progress finish, and once the stream is empty
    // that read would otherwise idle for the default 2 s inside the timed region.
    let config = WorkerConfig::new(stream, "g")
        .consumer("worker")
        .concurrency(in_flight)
        .block(std::time::Duration::from_millis(10));
    let worker = Worker::connect(url, config, svc).expect("worker");
    // Shutdown once every job ran: the graceful stop waits for the last acks.
    worker.run(all_done.notified()).await;
}

/// Who reads and acknowledges the stream.
#[derive(Clone, Copy, Debug)]
enum Consumer {
    /// `XREADGROUP COUNT n`, the batch's handlers, one `XACK` for the batch.
    Plain,
    /// tower-once's `Worker`.
    Worker,
}

impl Consumer {
    fn name(self) -> &'static str {
        match self {
            Consumer::Plain => "plain",
            Consumer::Worker => "worker",
        }
    }
}

/// The consumers each round runs, in this order.
const CONSUMERS: [Consumer; 2] = [Consumer::Plain, Consumer::Worker];

/// One timed round: jobs per second and commands per job.
fn round(
    rt: &tokio::runtime::Runtime,
    server: &RedisServer,
    consumer: Consumer,
    in_flight: usize,
    n: usize,
) -> (f64, f64) {
    let url = server.url();
    let stream = format!("bench-{}-{in_flight}-{n}", consumer.name());
    let mut conn = rt.block_on(async {
        ConnectionManager::new(redis::Client::open(url.as_str()).expect("url"))
            .await
            .expect("connect")
    });
    rt.block_on(fill(&mut conn, &stream));
    let before = commands(server);
    let started = Instant::now();
    rt.block_on(async {
        match consumer {
            Consumer::Plain => plain_loop(&mut conn, &stream, in_flight).await,
            Consumer::Worker => worker_run(&url, &stream, in_flight).await,
        }
    });
    let elapsed = started.elapsed();
    // The INFO call itself is one command.
    let spent = commands(server).saturating_sub(before + 1);
    let pending: Value = rt
        .block_on(
            redis::cmd("XPENDING")
                .arg(&stream)
                .arg("g")
                .query_async(&mut conn),
        )
        .expect("XPENDING");
    assert!(
        matches!(pending, Value::Array(ref p) if p.first() == Some(&Value::Int(0))),
        "all acked"
    );
    let _: () = rt
        .block_on(redis::cmd("DEL").arg(&stream).query_async(&mut conn))
        .expect("DEL");
    (
        JOBS as f64 / elapsed.as_secs_f64(),
        spent as f64 / JOBS as f64,
    )
}

fn main() {
    const ROUNDS: usize = 5;
    let server = RedisServer::start();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    println!("median of {ROUNDS} interleaved rounds of {JOBS} jobs");
    println!();
    let table = Table::new(&[
        "in flight",
        "consumer",
        "jobs/s",
        "commands/job",
        "jobs/s over the plain loop's",
    ]);
    for in_flight in [1usize, 16, 64] {
        // Per consumer: jobs per second and commands per job, one of each per round.
        let mut results: Vec<(Consumer, Vec<f64>, Vec<f64>)> = CONSUMERS
            .iter()
            .map(|&consumer| (consumer, Vec::new(), Vec::new()))
            .collect();
        // Interleaved, so a noisy neighbour hurts both consumers alike.
        for n in 0..ROUNDS {
            for (consumer, rates, per_job) in &mut results {
                let (rate, commands) = round(&rt, &server, *consumer, in_flight, n);
                rates.push(rate);
                per_job.push(commands);
            }
        }
        let plain = results
            .iter()
            .find(|(consumer, ..)| matches!(consumer, Consumer::Plain))
            .map(|(_, rates, _)| median(rates.iter().copied()))
            .expect("the plain loop is one of the consumers");
        for (consumer, rates, per_job) in results {
            let rate = median(rates);
            table.row(&[
                in_flight.to_string(),
                consumer.name().to_owned(),
                format!("{rate:.0}"),
                format!("{:.2}", median(per_job)),
                format!("{:.2}", rate / plain),
            ]);
        }
    }
}
