//! The Postgres idempotency store in process (benches/README.md, "Through the Postgres
//! store"): requests per second through one axum router at a fixed concurrency, a fresh key
//! through `IdempotencyLayer` on `PostgresStore` (the handler storing its response in its own
//! transaction with `Claim::respond_in`, or the layer completing the record), beside the same
//! handler deduping by hand (`INSERT` of its key `ON CONFLICT DO NOTHING` in its transaction);
//! a replay beside a hand-written primary-key `SELECT` of the stored response; and the memory
//! and Redis stores on the same handler, fresh and replayed.
//!
//! The rows are declared in `rows.rs` and run interleaved (each round runs every row in turn);
//! the table shows medians of the rounds and the median of the per-round ratios to each row's
//! peer. Before the rounds, a few sequential requests of each row count its round trips to
//! PostgreSQL (from sqlx's statement events). The callers, the app, PostgreSQL and
//! `redis-server` share the machine's cores; the CPU columns (per-thread CPU time from `/proc`
//! for the bench and for the pool's backends, `INFO cpu` for Redis) show where the time went.
//!
//! Needs the PostgreSQL of `DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/test`),
//! in which it creates a schema of its own, dropped at the end (panics included), and
//! `redis-server` on `PATH`: it starts one of its own on a free loopback port, killed on drop.
//!
//! ```sh
//! cargo bench --bench postgres --features postgres,redis
//! PG_BENCH_SECS=3 PG_BENCH_ROUNDS=7 PG_BENCH_TASKS=32 cargo bench --bench postgres --features postgres,redis
//! ```
//!
//! Settings (environment): `PG_BENCH_SECS` seconds per row and round (default 2),
//! `PG_BENCH_ROUNDS` (default 5), `PG_BENCH_TASKS` concurrent callers, and connections in the
//! pool that the handlers and `PostgresStore` share (default 16).
//!
//! Files: `rows.rs` the declared rows, peers and goals, `app.rs` the router, its handlers and
//! tables, `load.rs` one round of one row, `round_trips.rs` the statement count, `usage.rs` the
//! CPU, WAL and Redis readings, `results.rs` the table; the medians come from
//! `benches/support/report.rs`, the CPU readings from `benches/support/cpu.rs`.

#[path = "../support/cpu.rs"]
mod cpu;
#[path = "../support/env.rs"]
mod env;
#[path = "../support/report.rs"]
mod report;

mod app;
mod load;
mod results;
mod round_trips;
mod rows;
mod usage;

use app::App;
use load::replay_key;
use results::{Results, Sample};
use rows::{Keys, Route, Row, ROWS};
use std::time::Duration;
use tower_once::idempotency::store::redis::RedisStore;
use tower_once_test_support::postgres::{database_url, Schema};
use tower_once_test_support::redis::RedisServer;
use usage::Reading;

/// Sequential requests per row for the round-trip count.
const COUNTED: u64 = 20;
/// How long each row runs, untimed, before the first round.
const WARM_UP: Duration = Duration::from_millis(500);

/// The bench's settings, from the environment.
#[derive(Debug)]
struct Settings {
    round: Duration,
    rounds: usize,
    tasks: usize,
}

impl Settings {
    fn from_env() -> Self {
        Self {
            round: env::seconds("PG_BENCH_SECS", 2.0),
            rounds: env::var("PG_BENCH_ROUNDS", 5, 1..=100),
            tasks: env::var("PG_BENCH_TASKS", 16, 1..=64),
        }
    }
}

fn main() {
    // `cargo bench` passes `--bench`; `--list` from the test harness must not start anything.
    if std::env::args().any(|arg| arg == "--list") {
        return;
    }
    let settings = Settings::from_env();
    round_trips::install();
    let schema = Schema::create();
    let redis = RedisServer::start();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name(usage::THREAD)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let results = rt.block_on(run(&settings, &schema, &redis));
    results.print();
    // `schema` and `redis` (Drop guards) drop the schema and kill redis-server here, and on
    // any panic above.
    drop(rt);
    drop(redis);
    drop(schema);
}

async fn run(settings: &Settings, schema: &Schema, redis: &RedisServer) -> Results {
    let store = RedisStore::connect(&redis.url())
        .await
        .expect("valid URL")
        .key_prefix("pg-bench:");
    let connections = u32::try_from(settings.tasks).expect("at most 64 tasks");
    let app = App::start(&database_url(), &schema.name, connections, store).await;
    println!(
        "postgres: {} callers, a pool of {} connections, {} s per row, {} rounds, one runtime of \
         2 threads (callers and app), PostgreSQL at {}, redis-server on port {}; sharing {} \
         cores, nothing pinned",
        settings.tasks,
        connections,
        settings.round.as_secs_f64(),
        settings.rounds,
        database_url(),
        redis.port,
        std::thread::available_parallelism().map_or(0, |n| n.get()),
    );
    complete_replay_keys(&app, settings.tasks).await;
    let mut results = Results::new();
    count_round_trips(&app, &mut results).await;
    // A short warm-up of every row, discarded.
    for row in ROWS {
        let tag = format!("warm-{}", row.name);
        load::round(&app.router, row, &tag, settings.tasks, WARM_UP).await;
    }
    for round_no in 0..settings.rounds {
        for row in ROWS {
            let sample = sample(&app, row, round_no, settings, redis).await;
            eprintln!(
                "round {}: {:<20} {:>9.0} req/s{}",
                round_no + 1,
                row.name,
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
    app.pool.close().await;
    results
}

/// Completes each task's replay key on every replayed route: through the route's fresh row, or
/// for the hand-written replay by storing the response.
async fn complete_replay_keys(app: &App, tasks: usize) {
    let keys: Vec<String> = (0..tasks).map(replay_key).collect();
    for route in rows::replayed_routes() {
        if route == Route::HandSelect {
            app.store_responses(&keys).await;
            continue;
        }
        let fresh = ROWS
            .iter()
            .find(|row| row.route == route && row.keys == Keys::Fresh)
            .expect("a replayed route has a fresh row");
        for key in &keys {
            assert!(
                load::send(&app.router, fresh, key).await,
                "completing {key} on {route:?}"
            );
        }
    }
}

/// Counts each row's round trips to PostgreSQL over a few sequential requests.
async fn count_round_trips(app: &App, results: &mut Results) {
    for row in ROWS {
        let statements = round_trips::count(async {
            for n in 0..COUNTED {
                let key = match row.keys {
                    Keys::Fresh => format!("count-{}-{n}", row.name),
                    Keys::Replay => replay_key(0),
                };
                assert!(load::send(&app.router, row, &key).await, "{}", row.name);
            }
        })
        .await;
        results.set_round_trips(row, statements as f64 / COUNTED as f64);
    }
}

/// One timed round of `row`, with what it cost per request.
async fn sample(
    app: &App,
    row: &'static Row,
    round_no: usize,
    settings: &Settings,
    redis: &RedisServer,
) -> Sample {
    let backends = usage::backends(&app.pool, &app.application_name).await;
    let before = Reading::now(&app.pool, backends, redis).await;
    let tag = format!("r{round_no}-{}", row.name);
    let (counts, elapsed) =
        load::round(&app.router, row, &tag, settings.tasks, settings.round).await;
    Sample {
        per_sec: counts.ok as f64 / elapsed.as_secs_f64(),
        unexpected: counts.unexpected,
        usage: before.since(&app.pool, redis, counts.ok).await,
    }
}
