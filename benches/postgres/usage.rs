//! What a round cost besides its time, per expected answer: CPU of the bench's own threads
//! (callers and app share one runtime), of the pool's PostgreSQL backends and of
//! `redis-server`; WAL written; scripts sent to Redis.

use crate::cpu::{process_cpu_ns, redis_cpu_us, thread_cpu_ns};
use sqlx::PgPool;
use tower_once::idempotency::store::postgres::sqlx;
use tower_once_test_support::redis::RedisServer;

/// The name prefix of the bench's runtime threads.
pub(crate) const THREAD: &str = "pg-bench";

/// The readings at one moment; `None` where one could not be read.
#[derive(Debug)]
pub(crate) struct Reading {
    backends: Vec<u32>,
    bench_cpu_ns: Option<u64>,
    postgres_cpu_ns: Option<u64>,
    wal_bytes: Option<f64>,
    redis_cpu_us: Option<f64>,
    redis_scripts: u64,
}

/// A round's costs per expected answer.
#[derive(Default, Clone, Copy, Debug)]
pub(crate) struct PerRequest {
    pub(crate) bench_cpu_us: Option<f64>,
    pub(crate) postgres_cpu_us: Option<f64>,
    /// WAL the whole server wrote: an upper bound if anything else writes meanwhile.
    pub(crate) wal_bytes: Option<f64>,
    pub(crate) redis_cpu_us: Option<f64>,
    /// Round trips to Redis.
    pub(crate) redis_scripts: Option<f64>,
}

/// The process ids of the backends serving connections named `application_name`.
pub(crate) async fn backends(pool: &PgPool, application_name: &str) -> Vec<u32> {
    let pids: Vec<i32> =
        sqlx::query_scalar("SELECT pid FROM pg_stat_activity WHERE application_name = $1")
            .bind(application_name)
            .fetch_all(pool)
            .await
            .expect("read pg_stat_activity");
    pids.into_iter()
        .filter_map(|p| u32::try_from(p).ok())
        .collect()
}

/// The CPU time of `backends` together, if every one could be read.
fn backends_cpu_ns(backends: &[u32]) -> Option<u64> {
    backends.iter().map(|&pid| process_cpu_ns(pid)).sum()
}

async fn wal_bytes(pool: &PgPool) -> Option<f64> {
    sqlx::query_scalar("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::float8")
        .fetch_one(pool)
        .await
        .ok()
}

/// Script calls so far: what `RedisStore` sends, one per round trip (`INFO commandstats` also
/// counts the commands a script runs inside, so not every command is a round trip).
fn redis_scripts(redis: &RedisServer) -> u64 {
    redis
        .command_calls()
        .iter()
        .filter(|(name, _)| name.starts_with("eval"))
        .map(|(_, n)| n)
        .sum()
}

impl Reading {
    /// Reads everything now, for the backends `backends`.
    pub(crate) async fn now(pool: &PgPool, backends: Vec<u32>, redis: &RedisServer) -> Self {
        Self {
            bench_cpu_ns: thread_cpu_ns(THREAD),
            postgres_cpu_ns: backends_cpu_ns(&backends),
            wal_bytes: wal_bytes(pool).await,
            redis_cpu_us: redis_cpu_us(redis),
            redis_scripts: redis_scripts(redis),
            backends,
        }
    }

    /// What was spent since `self`, per one of `requests`.
    pub(crate) async fn since(
        self,
        pool: &PgPool,
        redis: &RedisServer,
        requests: u64,
    ) -> PerRequest {
        let requests = requests.max(1) as f64;
        let bench_cpu_ns = thread_cpu_ns(THREAD);
        let postgres_cpu_ns = backends_cpu_ns(&self.backends);
        let redis_cpu = redis_cpu_us(redis);
        let scripts = redis_scripts(redis).saturating_sub(self.redis_scripts);
        let wal = wal_bytes(pool).await;
        let ns = |before: Option<u64>, after: Option<u64>| {
            Some(after?.checked_sub(before?)? as f64 / 1e3 / requests)
        };
        let diff = |before: Option<f64>, after: Option<f64>| Some((after? - before?) / requests);
        PerRequest {
            bench_cpu_us: ns(self.bench_cpu_ns, bench_cpu_ns),
            postgres_cpu_us: ns(self.postgres_cpu_ns, postgres_cpu_ns),
            wal_bytes: diff(self.wal_bytes, wal),
            redis_cpu_us: diff(self.redis_cpu_us, redis_cpu),
            redis_scripts: Some(scripts as f64 / requests),
        }
    }
}
