//! HTTP load on loopback (benches/README.md, "Under HTTP load on loopback"): one process serves
//! axum with a bare route and the same handler behind `IdempotencyLayer` on the memory store, on
//! the Redis store and on the Postgres store, and a hyper load generator in the same process drives it over N keep-alive
//! connections for a fixed time per round, with a 1 KiB JSON body. Fresh rows send a unique
//! `Idempotency-Key` per request; replay rows cycle over a few keys completed before the first
//! round. One more row sends the Redis store's claim script (what a replay costs in Redis)
//! directly with the `redis` crate at the same concurrency, so the Redis replay row can be read
//! against it.
//!
//! The rows are declared in `rows.rs` and run interleaved (each round runs every row in turn);
//! the table shows medians of the rounds and the median of the per-round ratios. The server, the
//! load generator and `redis-server` share the machine's cores: nothing is pinned, so the load
//! generator's own CPU dilutes every ratio towards 1. The CPU columns (per-thread CPU time from
//! `/proc`, and `INFO cpu` for Redis) show where the time went.
//!
//! The last column counts answers that were not what the row expects: a transport error, a
//! status other than `201`, or a replay row's answer without `Idempotent-Replayed` (its record
//! was evicted: the fresh rows fill the memory store to its default bound of 100 000 records,
//! and then it drops the oldest completed ones).
//!
//! Starts its own `redis-server` on a free loopback port, killed on drop (panics included), and
//! keeps the Postgres store's records in a schema of its own in `DATABASE_URL` (default
//! `postgres://postgres@127.0.0.1:5432/test`), dropped on drop.
//!
//! ```sh
//! cargo bench --bench http_load --features redis,postgres
//! LOAD_SECS=5 LOAD_ROUNDS=5 LOAD_CONNS=64 cargo bench --bench http_load --features redis,postgres
//! ```
//!
//! `LOAD_PROFILE=memory_fresh` (or `bare`, `memory_replay`, `redis_fresh`, `redis_replay`,
//! `postgres_fresh`, `postgres_replay`, `raw_script`) runs that row alone once, for a profiler.
//!
//! Settings (environment): `LOAD_SECS` seconds per row and round (default 3), `LOAD_ROUNDS`
//! (default 3), `LOAD_CONNS` concurrent connections, and concurrent script callers on the raw
//! row (default 32), `LOAD_CLIENT_THREADS` load generator threads (default 2; the server has 2).
//!
//! Files: `rows.rs` the declared rows and ratios, `server.rs` the app, `client/` the load
//! generator (`load.rs` one round's connections and script callers, `warm.rs` the replay keys),
//! `runner.rs` the runtimes and one row's round, `results.rs` the table; the medians come from
//! `benches/support/report.rs`, the CPU readings from `benches/support/cpu.rs`.

#[path = "../support/cpu.rs"]
mod cpu;
#[path = "../support/env.rs"]
mod env;
#[path = "../support/report.rs"]
mod report;

mod client;
mod results;
mod rows;
mod runner;
mod server;
mod settings;

use results::Results;
use rows::ROWS;
use runner::{Runner, SERVER_THREADS};
use settings::Settings;
use std::time::Duration;
use tower_once_test_support::postgres::Schema;
use tower_once_test_support::redis::RedisServer;

fn main() {
    // `cargo bench` passes `--bench`; a filter or `--list` from the test harness means nothing
    // here, but `--list` must not start a server.
    if std::env::args().any(|arg| arg == "--list") {
        return;
    }
    let settings = Settings::from_env();
    let redis = RedisServer::start();
    let schema = Schema::create();
    let runner = Runner::start(settings, &redis, &schema);

    let s = &runner.settings;
    println!(
        "http_load: {} connections, {} s per row, {} rounds, server {SERVER_THREADS} threads, \
         load generator {} threads, redis-server on port {}; all on loopback, sharing {} cores, \
         nothing pinned",
        s.connections,
        s.round.as_secs_f64(),
        s.rounds,
        s.client_threads,
        redis.port,
        std::thread::available_parallelism().map_or(0, |n| n.get()),
    );
    if let Ok(name) = std::env::var("LOAD_PROFILE") {
        profile(&runner, &redis, &name);
        return;
    }
    // A short warm-up of every row (allocator, connection pools, Redis script cache), discarded.
    for row in ROWS {
        runner.run(row, usize::MAX, Duration::from_millis(500));
    }

    let mut results = Results::new();
    for round_no in 0..runner.settings.rounds {
        for row in ROWS {
            let sample = runner.sample(row, round_no, &redis);
            eprintln!(
                "round {}: {:<40} {:>9.0} req/s{}",
                round_no + 1,
                row.label,
                sample.per_sec,
                if sample.unexpected > 0 {
                    format!(" ({} answers not as expected)", sample.unexpected)
                } else {
                    String::new()
                }
            );
            results.push(row, sample);
        }
    }
    results.print();
    // `redis` and `schema` (Drop guards) kill redis-server and drop the schema here, and on any
    // panic above.
    drop(runner);
    drop(schema);
    drop(redis);
}

/// One row alone for `LOAD_SECS`, for a profiler (`perf record -e cpu-clock -g`, then
/// `perf report --sort comm,symbol`: the server's threads are named load-server).
fn profile(runner: &Runner, redis: &RedisServer, name: &str) {
    let row = ROWS
        .iter()
        .find(|row| row.name == name)
        .unwrap_or_else(|| panic!("LOAD_PROFILE is one of {:?}", rows::names()));
    let sample = runner.sample(row, 0, redis);
    println!(
        "{}: {:.0} req/s, server CPU {} µs/request",
        row.label,
        sample.per_sec,
        sample
            .server_cpu_us
            .map_or_else(|| "?".to_owned(), |us| format!("{us:.1}"))
    );
}
