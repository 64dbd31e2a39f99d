//! The runner: the two runtimes (server and load generator), the app, and one row's round.

use crate::client::{self, Counts, HttpTarget, Round, ScriptTarget};
use crate::cpu::{redis_cpu_us, thread_cpu_ns};
use crate::rows::{Mode, Row, COVERED};
use crate::server;
use crate::settings::Settings;
use http::HeaderValue;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::runtime::Runtime;
use tokio::sync::Barrier;
use tower_once::idempotency::store::postgres::sqlx::postgres::PgPoolOptions;
use tower_once::idempotency::store::postgres::PostgresStore;
use tower_once::idempotency::store::redis::redis::{self, Script};
use tower_once::idempotency::store::redis::{RedisStore, CLAIM_SCRIPT};
use tower_once_test_support::postgres::{database_url, Schema};
use tower_once_test_support::redis::RedisServer;

/// Keys completed before the first round and replayed by the replay rows.
const REPLAY_KEYS: usize = 16;
/// Server worker threads.
pub(crate) const SERVER_THREADS: usize = 2;
/// The Postgres store's pool.
const PG_CONNECTIONS: u32 = 16;
/// Thread name prefixes, which the CPU columns add up by.
const SERVER_THREAD: &str = "load-server";
const CLIENT_THREAD: &str = "load-client";
const REDIS_PREFIX: &str = "http-load:";
/// How long past its end a round (or the warm-up) may take before the bench gives up.
const GRACE: Duration = Duration::from_secs(30);

/// What one round of one row measured.
#[derive(Default, Clone, Copy, Debug)]
pub(crate) struct Sample {
    pub(crate) per_sec: f64,
    pub(crate) unexpected: u64,
    /// CPU per expected answer, in µs: the server's threads, the load generator's, Redis's.
    pub(crate) server_cpu_us: Option<f64>,
    pub(crate) client_cpu_us: Option<f64>,
    pub(crate) redis_cpu_us: Option<f64>,
}

/// Everything a round needs.
pub(crate) struct Runner {
    pub(crate) settings: Settings,
    server_rt: Runtime,
    client_rt: Runtime,
    http: HttpTarget,
    script: ScriptTarget,
}

impl Runner {
    /// Builds both runtimes, serves the app (the Postgres store's table in `schema`), and
    /// completes the replay keys on every store.
    pub(crate) fn start(settings: Settings, redis: &RedisServer, schema: &Schema) -> Self {
        let server_rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(SERVER_THREADS)
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
        let postgres = server_rt.block_on(async {
            let pool = PgPoolOptions::new()
                .max_connections(PG_CONNECTIONS)
                .connect(&database_url())
                .await
                .expect("connect to PostgreSQL");
            let store = PostgresStore::new(pool)
                .table(&format!("{}.idem", schema.name))
                .expect("a valid table name");
            store.migrate().await.expect("create the records table");
            store
        });
        let addr = server_rt.block_on(server::serve(store, postgres));
        let replay_keys: Vec<HeaderValue> = (0..REPLAY_KEYS)
            .map(|i| HeaderValue::from_str(&format!("replay-{i}")).expect("a valid key"))
            .collect();
        let http = HttpTarget {
            addr,
            body: server::json_body(),
            replay_keys: Arc::new(replay_keys),
        };

        let created = client_rt.block_on(async {
            tokio::time::timeout(GRACE, client::complete_replay_keys(http.clone()))
                .await
                .expect("the replay keys completed in time")
        });
        assert_eq!(
            created,
            COVERED.len() * REPLAY_KEYS,
            "every replay key completed"
        );
        // Only the replay records exist in Redis yet: they are the raw row's keys.
        let keys: Vec<String> = server_rt.block_on({
            let mut connection = connection.clone();
            async move {
                redis::cmd("KEYS")
                    .arg(format!("{REDIS_PREFIX}*"))
                    .query_async(&mut connection)
                    .await
                    .expect("KEYS")
            }
        });
        assert_eq!(keys.len(), REPLAY_KEYS, "one Redis record per replay key");
        let script = ScriptTarget {
            script: Arc::new(Script::new(CLAIM_SCRIPT)),
            connection,
            keys: Arc::new(keys),
        };
        Self {
            settings,
            server_rt,
            client_rt,
            http,
            script,
        }
    }

    /// Runs `row` for `length`: the expected answers, the others, and the time taken. The
    /// direct script callers run on the server's threads, so the server CPU column is theirs.
    pub(crate) fn run(
        &self,
        row: &'static Row,
        round_no: usize,
        length: Duration,
    ) -> (Counts, Duration) {
        let n = self.settings.connections;
        let round = Round {
            start: Arc::new(Barrier::new(n + 1)),
            length,
        };
        let (rt, tasks) = match row.mode {
            Mode::ClaimScript => {
                let tasks: Vec<_> = (0..n)
                    .map(|_| {
                        self.server_rt
                            .spawn(client::script_caller(self.script.clone(), round.clone()))
                    })
                    .collect();
                (&self.server_rt, tasks)
            }
            Mode::Fresh | Mode::Replay => {
                let tasks: Vec<_> = (0..n)
                    .map(|c| {
                        self.client_rt.spawn(client::http_connection(
                            self.http.clone(),
                            row,
                            format!("r{round_no}-{}-c{c}", row.name),
                            round.clone(),
                        ))
                    })
                    .collect();
                (&self.client_rt, tasks)
            }
        };
        let start = round.start;
        let round_and_join = async move {
            start.wait().await;
            let started = Instant::now();
            let mut total = Counts::default();
            for task in tasks {
                total.add(task.await.expect("load task"));
            }
            (total, started.elapsed())
        };
        // A task that panicked before the barrier, or a request that never ends, must not hang
        // the bench: give up (panic, which kills redis-server through its guard) instead.
        rt.block_on(async move {
            tokio::time::timeout(length + GRACE, round_and_join)
                .await
                .expect("a round finished within its time and a grace period")
        })
    }

    /// [`run`](Self::run) for one round's length, with the CPU each side spent per request.
    pub(crate) fn sample(&self, row: &'static Row, round_no: usize, redis: &RedisServer) -> Sample {
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
        let us = |v: Option<u64>| v.map(|v| v as f64 / 1e3);
        Sample {
            per_sec: counts.ok as f64 / elapsed.as_secs_f64(),
            unexpected: counts.unexpected,
            server_cpu_us: per_request(us(before.0), us(after.0)),
            client_cpu_us: per_request(us(before.1), us(after.1)),
            redis_cpu_us: per_request(before.2, after.2),
        }
    }
}
