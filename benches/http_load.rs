//! HTTP load on loopback (README "Under HTTP load on loopback"): one process serves axum with a
//! bare route and the same handler behind `IdempotencyLayer` on the memory store and on the Redis
//! store, and a hyper load generator in the same process drives it over N keep-alive connections
//! for a fixed time per round, with a 1 KiB JSON body. Fresh rows send a unique `Idempotency-Key`
//! per request; replay rows cycle over a few keys completed before the first round. One more row
//! sends the Redis store's claim script (what a replay costs in Redis) directly with the `redis`
//! crate at the same concurrency, so the Redis replay row can be read against it.
//!
//! Rows are interleaved (bare, memory fresh, memory replay, Redis fresh, Redis replay, raw
//! script, then again); the table shows medians of the rounds and the median of the per-round
//! ratios. The server, the load generator and `redis-server` share the machine's cores: nothing
//! is pinned, so the load generator's own CPU dilutes every ratio towards 1. The CPU columns
//! (per-thread CPU time from `/proc`, and `INFO cpu` for Redis) show where the time went.
//!
//! The last column counts answers that were not what the row expects: a transport error, a
//! status other than `201`, or a replay row's answer without `Idempotent-Replayed` (its record
//! was evicted: the fresh rows fill the memory store to its default bound of 100 000 records,
//! and then it drops the oldest completed ones).
//!
//! Starts its own `redis-server` on a free loopback port, killed on drop (panics included).
//!
//! ```sh
//! cargo bench --bench http_load --features redis
//! LOAD_SECS=5 LOAD_ROUNDS=5 LOAD_CONNS=64 cargo bench --bench http_load --features redis
//! ```
//!
//! `LOAD_PROFILE=memory_fresh` (or `bare`, `memory_replay`, `redis_fresh`, `redis_replay`,
//! `raw_script`) runs that row alone once, for a profiler.
//!
//! Settings (environment): `LOAD_SECS` seconds per row and round (default 3), `LOAD_ROUNDS`
//! (default 3), `LOAD_CONNS` concurrent connections, and concurrent script callers on the raw
//! row (default 32), `LOAD_CLIENT_THREADS` load generator threads (default 2; the server has 2).

use axum::body::Bytes;
use axum::routing::post;
use axum::Router;
use http::header::{CONTENT_TYPE, HOST};
use http::{HeaderValue, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::TcpStream;
use tokio::sync::Barrier;
use tower_once::idempotency::store::redis::redis::{self, aio::ConnectionManager, Script, Value};
use tower_once::idempotency::store::redis::{RedisStore, CLAIM_SCRIPT};
use tower_once::idempotency::{IdempotencyLayer, IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED};
use tower_once_test_support::redis::RedisServer;

/// Keys completed before the first round and replayed by the replay rows.
const REPLAY_KEYS: usize = 16;
const BODY_LEN: usize = 1024;
const SERVER_THREAD: &str = "load-server";
const CLIENT_THREAD: &str = "load-client";
const REDIS_PREFIX: &str = "http-load:";
/// How long past its end a round (or the warm-up) may take before the bench gives up.
const GRACE: Duration = Duration::from_secs(30);

struct Settings {
    round: Duration,
    rounds: usize,
    connections: usize,
    client_threads: usize,
}

impl Settings {
    fn from_env() -> Self {
        fn var<T: std::str::FromStr>(name: &str, default: T) -> T {
            match std::env::var(name) {
                Ok(value) => value
                    .parse()
                    .unwrap_or_else(|_| panic!("{name}={value} is not a valid value")),
                Err(_) => default,
            }
        }
        let secs: f64 = var("LOAD_SECS", 3.0);
        assert!(secs > 0.0 && secs <= 600.0, "LOAD_SECS must be in (0, 600]");
        let settings = Self {
            round: Duration::from_secs_f64(secs),
            rounds: var("LOAD_ROUNDS", 3),
            connections: var("LOAD_CONNS", 32),
            client_threads: var("LOAD_CLIENT_THREADS", 2),
        };
        assert!(
            (1..=100).contains(&settings.rounds),
            "LOAD_ROUNDS in 1..=100"
        );
        assert!(
            (1..=4096).contains(&settings.connections),
            "LOAD_CONNS in 1..=4096"
        );
        assert!(
            (1..=64).contains(&settings.client_threads),
            "LOAD_CLIENT_THREADS in 1..=64"
        );
        settings
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Row {
    Bare,
    MemoryFresh,
    MemoryReplay,
    RedisFresh,
    RedisReplay,
    RawScript,
}

const ROWS: [Row; 6] = [
    Row::Bare,
    Row::MemoryFresh,
    Row::MemoryReplay,
    Row::RedisFresh,
    Row::RedisReplay,
    Row::RawScript,
];

impl Row {
    fn label(self) -> &'static str {
        match self {
            Row::Bare => "bare handler",
            Row::MemoryFresh => "memory store, fresh key",
            Row::MemoryReplay => "memory store, replay",
            Row::RedisFresh => "Redis store, fresh key",
            Row::RedisReplay => "Redis store, replay",
            Row::RawScript => "claim script sent directly (no HTTP)",
        }
    }

    /// The row's name for `LOAD_PROFILE`.
    fn name(self) -> &'static str {
        match self {
            Row::Bare => "bare",
            Row::MemoryFresh => "memory_fresh",
            Row::MemoryReplay => "memory_replay",
            Row::RedisFresh => "redis_fresh",
            Row::RedisReplay => "redis_replay",
            Row::RawScript => "raw_script",
        }
    }

    fn path(self) -> &'static str {
        match self {
            Row::Bare => "/bare",
            Row::MemoryFresh | Row::MemoryReplay => "/memory",
            Row::RedisFresh | Row::RedisReplay | Row::RawScript => "/redis",
        }
    }

    fn replays(self) -> bool {
        matches!(self, Row::MemoryReplay | Row::RedisReplay)
    }
}

/// The handler of every route: reads the whole body and answers a small JSON document.
async fn create(body: Bytes) -> (StatusCode, [(&'static str, &'static str); 1], String) {
    (
        StatusCode::CREATED,
        [("content-type", "application/json")],
        format!(r#"{{"id":"ch_1","received":{}}}"#, body.len()),
    )
}

/// A JSON document of exactly `BODY_LEN` bytes.
fn json_body() -> Bytes {
    let head = r#"{"order_id":"A","amount":500,"note":""#;
    let tail = r#""}"#;
    let pad = "x".repeat(BODY_LEN - head.len() - tail.len());
    let body = format!("{head}{pad}{tail}");
    assert_eq!(body.len(), BODY_LEN);
    Bytes::from(body)
}

/// What one round of one row measured.
#[derive(Default, Clone, Copy)]
struct Sample {
    per_sec: f64,
    unexpected: u64,
    server_cpu_us: Option<f64>,
    client_cpu_us: Option<f64>,
    redis_cpu_us: Option<f64>,
}

/// CPU time (ns) spent so far by this process's threads whose name starts with `prefix`, from
/// `/proc/self/task/*/schedstat`; `None` where that is not available (not Linux).
fn thread_cpu_ns(prefix: &str) -> Option<u64> {
    let mut total = 0;
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let dir = task.ok()?.path();
        let Ok(name) = std::fs::read_to_string(dir.join("comm")) else {
            continue; // the thread ended meanwhile
        };
        if !name.starts_with(prefix) {
            continue;
        }
        let Ok(stat) = std::fs::read_to_string(dir.join("schedstat")) else {
            continue;
        };
        total += stat.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(total)
}

/// `redis-server`'s CPU time so far (user + system, µs), from `INFO cpu`.
fn redis_cpu_us(redis: &RedisServer) -> Option<f64> {
    let info = redis.cli(&["INFO", "cpu"]);
    let field = |name: &str| -> Option<f64> {
        info.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))?
            .trim()
            .parse()
            .ok()
    };
    Some((field("used_cpu_user")? + field("used_cpu_sys")?) * 1e6)
}

/// Counts of one load task.
#[derive(Default)]
struct Counts {
    ok: u64,
    unexpected: u64,
}

/// One keep-alive connection sending requests back to back until `round` has passed since the
/// barrier. Fresh rows send `id-n` keys, replay rows cycle over `replay_keys`.
async fn http_connection(
    addr: SocketAddr,
    row: Row,
    id: String,
    body: Bytes,
    replay_keys: Arc<Vec<HeaderValue>>,
    round: Duration,
    start: Arc<Barrier>,
) -> Counts {
    let stream = TcpStream::connect(addr)
        .await
        .expect("connect to the server");
    stream.set_nodelay(true).expect("TCP_NODELAY");
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("HTTP/1 handshake");
    tokio::spawn(connection);
    let host = HeaderValue::from_str(&addr.to_string()).expect("an address is a valid header");
    let mut counts = Counts::default();
    start.wait().await;
    let end = Instant::now() + round;
    let mut n = 0usize;
    while Instant::now() < end {
        let key = if row.replays() {
            replay_keys[n % replay_keys.len()].clone()
        } else {
            HeaderValue::from_str(&format!("{id}-{n}")).expect("a valid key")
        };
        n += 1;
        let request = Request::post(row.path())
            .header(HOST, host.clone())
            .header(CONTENT_TYPE, "application/json")
            .header(IDEMPOTENCY_KEY, key)
            .body(Full::new(body.clone()))
            .expect("valid request parts");
        if sender.ready().await.is_err() {
            counts.unexpected += 1;
            break;
        }
        let Ok(response) = sender.send_request(request).await else {
            counts.unexpected += 1;
            break;
        };
        let expected = response.status() == StatusCode::CREATED
            && response.headers().contains_key(IDEMPOTENT_REPLAYED) == row.replays();
        match response.into_body().collect().await {
            Ok(_) if expected => counts.ok += 1,
            Ok(_) => counts.unexpected += 1,
            Err(_) => {
                counts.unexpected += 1;
                break;
            }
        }
    }
    counts
}

/// One caller sending the claim script on completed records until `round` has passed.
async fn script_caller(
    script: Arc<Script>,
    mut connection: ConnectionManager,
    keys: Arc<Vec<String>>,
    round: Duration,
    start: Arc<Barrier>,
) -> Counts {
    let mut counts = Counts::default();
    start.wait().await;
    let end = Instant::now() + round;
    let mut n = 0usize;
    while Instant::now() < end {
        let key = &keys[n % keys.len()];
        n += 1;
        // The arguments the store sends: a 16-byte token, a 32-byte fingerprint, the lease.
        let reply: Result<Value, _> = script
            .key(key)
            .arg(&[8u8; 16][..])
            .arg(&[1u8; 32][..])
            .arg(10_000)
            .invoke_async(&mut connection)
            .await;
        match reply {
            // A completed record answers `c` and the stored response.
            Ok(Value::Array(parts)) if parts.len() == 6 => counts.ok += 1,
            _ => counts.unexpected += 1,
        }
    }
    counts
}

/// Everything a round needs.
struct Bench {
    settings: Settings,
    server_rt: tokio::runtime::Runtime,
    client_rt: tokio::runtime::Runtime,
    addr: SocketAddr,
    body: Bytes,
    replay_keys: Arc<Vec<HeaderValue>>,
    script: Arc<Script>,
    connection: ConnectionManager,
    replay_redis_keys: Arc<Vec<String>>,
}

impl Bench {
    /// Runs one row for `round`: the expected answers, the others, and the time taken.
    fn run(&self, row: Row, round_no: usize, round: Duration) -> (Counts, Duration) {
        let n = self.settings.connections;
        let start = Arc::new(Barrier::new(n + 1));
        let (rt, tasks) = if row == Row::RawScript {
            let tasks: Vec<_> = (0..n)
                .map(|_| {
                    self.server_rt.spawn(script_caller(
                        self.script.clone(),
                        self.connection.clone(),
                        self.replay_redis_keys.clone(),
                        round,
                        start.clone(),
                    ))
                })
                .collect();
            (&self.server_rt, tasks)
        } else {
            let tasks: Vec<_> = (0..n)
                .map(|c| {
                    self.client_rt.spawn(http_connection(
                        self.addr,
                        row,
                        format!("r{round_no}-{}-c{c}", row as usize),
                        self.body.clone(),
                        self.replay_keys.clone(),
                        round,
                        start.clone(),
                    ))
                })
                .collect();
            (&self.client_rt, tasks)
        };
        let round_and_join = async move {
            start.wait().await;
            let started = Instant::now();
            let mut total = Counts::default();
            for task in tasks {
                let counts = task.await.expect("load task");
                total.ok += counts.ok;
                total.unexpected += counts.unexpected;
            }
            (total, started.elapsed())
        };
        // A task that panicked before the barrier, or a request that never ends, must not hang
        // the bench: give up (panic, which kills redis-server through its guard) instead.
        rt.block_on(async move {
            tokio::time::timeout(round + GRACE, round_and_join)
                .await
                .expect("a round finished within its time and a grace period")
        })
    }

    /// [`run`](Self::run) with the CPU each side spent per request.
    fn sample(&self, row: Row, round_no: usize, redis: &RedisServer) -> Sample {
        let before = (
            thread_cpu_ns(SERVER_THREAD),
            thread_cpu_ns(CLIENT_THREAD),
            redis_cpu_us(redis),
        );
        let (counts, elapsed) = self.run(row, round_no, self.settings.round);
        let after = (
            thread_cpu_ns(SERVER_THREAD),
            thread_cpu_ns(CLIENT_THREAD),
            redis_cpu_us(redis),
        );
        let requests = counts.ok.max(1) as f64;
        let per_request = |a: Option<f64>, b: Option<f64>| Some((b? - a?) / requests);
        let ns = |v: Option<u64>| v.map(|v| v as f64 / 1e3);
        Sample {
            per_sec: counts.ok as f64 / elapsed.as_secs_f64(),
            unexpected: counts.unexpected,
            server_cpu_us: per_request(ns(before.0), ns(after.0)),
            client_cpu_us: per_request(ns(before.1), ns(after.1)),
            redis_cpu_us: per_request(before.2, after.2),
        }
    }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len() % 2 == 1 {
        values[mid]
    } else {
        (values[mid - 1] + values[mid]) / 2.0
    }
}

fn rate(per_sec: f64) -> String {
    if per_sec >= 1000.0 {
        format!("{:.1} k", per_sec / 1000.0)
    } else {
        format!("{per_sec:.0}")
    }
}

fn cpu(samples: &[Sample], pick: fn(&Sample) -> Option<f64>) -> String {
    let values: Option<Vec<f64>> = samples.iter().map(pick).collect();
    match values {
        Some(values) => format!("{:.1}", median(values)),
        None => "n/a".to_owned(),
    }
}

fn main() {
    // `cargo bench` passes `--bench`; a filter or `--list` from the test harness means nothing
    // here, but `--list` must not start a server.
    if std::env::args().any(|arg| arg == "--list") {
        return;
    }
    let settings = Settings::from_env();
    let redis = RedisServer::start();
    let server_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name(SERVER_THREAD)
        .enable_all()
        .build()
        .expect("server runtime");
    let client_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(settings.client_threads)
        .thread_name(CLIENT_THREAD)
        .enable_all()
        .build()
        .expect("client runtime");

    let store = server_rt
        .block_on(RedisStore::connect(&redis.url()))
        .expect("valid URL")
        .key_prefix(REDIS_PREFIX);
    let connection = store.connection().clone();
    let app = Router::new()
        .route("/bare", post(create))
        .merge(
            Router::new()
                .route("/memory", post(create))
                .route_layer(IdempotencyLayer::new()),
        )
        .merge(
            Router::new()
                .route("/redis", post(create))
                .route_layer(IdempotencyLayer::with_store(store)),
        );
    let addr = server_rt.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let addr = listener.local_addr().expect("local address");
        tokio::spawn(async move { axum::serve(listener, app).await });
        addr
    });

    let replay_keys: Vec<HeaderValue> = (0..REPLAY_KEYS)
        .map(|i| HeaderValue::from_str(&format!("replay-{i}")).expect("a valid key"))
        .collect();
    let mut bench = Bench {
        settings,
        server_rt,
        client_rt,
        addr,
        body: json_body(),
        replay_keys: Arc::new(replay_keys),
        script: Arc::new(Script::new(CLAIM_SCRIPT)),
        connection,
        replay_redis_keys: Arc::new(Vec::new()),
    };

    // Complete the replay keys on both stores: a fresh-key row over just those keys, one
    // request per key (then every replay row finds them completed).
    let warm = bench.client_rt.block_on({
        let (addr, body, keys) = (bench.addr, bench.body.clone(), bench.replay_keys.clone());
        let warm_up = async move {
            let stream = TcpStream::connect(addr).await.expect("connect");
            let (mut sender, connection) =
                hyper::client::conn::http1::handshake(TokioIo::new(stream))
                    .await
                    .expect("handshake");
            tokio::spawn(connection);
            let mut created = 0;
            for path in ["/memory", "/redis"] {
                for key in keys.iter() {
                    sender.ready().await.expect("connection open");
                    let request = Request::post(path)
                        .header(HOST, addr.to_string())
                        .header(CONTENT_TYPE, "application/json")
                        .header(IDEMPOTENCY_KEY, key.clone())
                        .body(Full::new(body.clone()))
                        .expect("valid request parts");
                    let response = sender.send_request(request).await.expect("warm-up request");
                    if response.status() == StatusCode::CREATED {
                        created += 1;
                    }
                    response.into_body().collect().await.expect("warm-up body");
                }
            }
            created
        };
        async move {
            tokio::time::timeout(GRACE, warm_up)
                .await
                .expect("the replay keys completed in time")
        }
    });
    assert_eq!(warm, 2 * REPLAY_KEYS, "every replay key completed");
    // Only the replay records exist in Redis yet: they are the raw row's keys.
    let keys: Vec<String> = bench.server_rt.block_on({
        let mut connection = bench.connection.clone();
        async move {
            redis::cmd("KEYS")
                .arg(format!("{REDIS_PREFIX}*"))
                .query_async(&mut connection)
                .await
                .expect("KEYS")
        }
    });
    assert_eq!(keys.len(), REPLAY_KEYS, "one Redis record per replay key");
    bench.replay_redis_keys = Arc::new(keys);

    let s = &bench.settings;
    println!(
        "http_load: {} connections, {} s per row, {} rounds, server 2 threads, load generator \
         {} threads, redis-server on port {}; all on loopback, sharing {} cores, nothing pinned",
        s.connections,
        s.round.as_secs_f64(),
        s.rounds,
        s.client_threads,
        redis.port,
        std::thread::available_parallelism().map_or(0, |n| n.get()),
    );
    if let Ok(name) = std::env::var("LOAD_PROFILE") {
        // One row alone for LOAD_SECS, for a profiler (`perf record -e cpu-clock -g`, then
        // `perf report --sort comm,symbol`: the server's threads are named load-server).
        let row = ROWS
            .into_iter()
            .find(|row| row.name() == name)
            .unwrap_or_else(|| panic!("LOAD_PROFILE is one of {:?}", ROWS.map(Row::name)));
        let sample = bench.sample(row, 0, &redis);
        println!(
            "{}: {:.0} req/s, server CPU {} µs/request",
            row.label(),
            sample.per_sec,
            sample
                .server_cpu_us
                .map_or_else(|| "?".to_owned(), |us| format!("{us:.1}"))
        );
        return;
    }
    // A short warm-up of every row (allocator, connection pools, Redis script cache), discarded.
    for row in ROWS {
        bench.run(row, usize::MAX, Duration::from_millis(500));
    }

    let mut samples: Vec<Vec<Sample>> = vec![Vec::new(); ROWS.len()];
    for round_no in 0..bench.settings.rounds {
        for (i, row) in ROWS.into_iter().enumerate() {
            let sample = bench.sample(row, round_no, &redis);
            eprintln!(
                "round {}: {:<40} {:>9.0} req/s{}",
                round_no + 1,
                row.label(),
                sample.per_sec,
                if sample.unexpected > 0 {
                    format!(" ({} answers not as expected)", sample.unexpected)
                } else {
                    String::new()
                }
            );
            samples[i].push(sample);
        }
    }

    let bare = &samples[0];
    println!();
    println!(
        "| route | req/s, median | rounds | ratio to bare | server CPU µs/req | load generator \
         CPU µs/req | redis-server CPU µs/req | answers not as expected |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for (row, row_samples) in ROWS.iter().zip(&samples) {
        let ratio = if *row == Row::RawScript {
            "–".to_owned()
        } else {
            let ratios = row_samples
                .iter()
                .zip(bare)
                .map(|(s, b)| s.per_sec / b.per_sec)
                .collect();
            format!("{:.2}", median(ratios))
        };
        let rounds: Vec<String> = row_samples.iter().map(|s| rate(s.per_sec)).collect();
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            row.label(),
            rate(median(row_samples.iter().map(|s| s.per_sec).collect())),
            rounds.join(", "),
            ratio,
            cpu(row_samples, |s| s.server_cpu_us),
            cpu(row_samples, |s| s.client_cpu_us),
            cpu(row_samples, |s| s.redis_cpu_us),
            row_samples.iter().map(|s| s.unexpected).sum::<u64>(),
        );
    }
    let to_raw = |row: usize| {
        median(
            samples[row]
                .iter()
                .zip(&samples[5])
                .map(|(http, raw)| http.per_sec / raw.per_sec)
                .collect(),
        )
    };
    println!();
    println!(
        "Redis store replay / claim script sent directly, same concurrency: {:.2} (goal ≥ 0.90); \
         bare handler / claim script: {:.2} (what HTTP alone leaves on this machine)",
        to_raw(4),
        to_raw(0),
    );
    println!(
        "Ratios are medians of per-round ratios. The load generator runs on the same cores as \
         the server (and redis-server): its CPU is part of every request's cost, which pulls \
         the ratios towards 1."
    );
    // `redis` (a Drop guard) kills redis-server here, and on any panic above.
    drop(bench);
    drop(redis);
}
