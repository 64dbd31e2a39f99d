//! What the outbox tests share: a pool on a PostgreSQL schema or database of their own (made
//! and dropped by `tower-once-test-support`), a count of sends per dedupe key, and a relay
//! configuration with a short lease.
#![allow(dead_code)] // each test binary uses part of this module

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;
use std::collections::HashMap;
use std::future::Future;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tower_once_outbox::{Enqueued, Outbox, OutboxMessage, RelayConfig};
use tower_once_retry::backoff::Backoff;
use tower_once_test_support::postgres::{self, database_url};

/// A schema of its own (`DATABASE_URL`, default `postgres://postgres@127.0.0.1:5432/test`),
/// dropped (with `psql`, so it happens even after a panic) on drop, and a pool on it. Its
/// connections carry `application_name = <schema>`, so a test can kill exactly them.
pub(crate) struct Schema {
    // First: the schema is dropped before the pool closes.
    _schema: postgres::Schema,
    pub(crate) name: String,
    pub(crate) pool: PgPool,
}

impl Schema {
    pub(crate) async fn new() -> Self {
        Self::with_pool(8).await
    }

    pub(crate) async fn with_pool(max: u32) -> Self {
        let schema = postgres::Schema::create();
        let name = schema.name.clone();
        let pool = Self::pool_for(&name, max, Duration::from_secs(30)).await;
        Self {
            _schema: schema,
            name,
            pool,
        }
    }

    pub(crate) fn options(name: &str) -> PgConnectOptions {
        PgConnectOptions::from_str(&database_url())
            .unwrap()
            .options([("search_path", name)])
            .application_name(name)
    }

    pub(crate) async fn pool_for(name: &str, max: u32, acquire: Duration) -> PgPool {
        PgPoolOptions::new()
            .max_connections(max)
            .acquire_timeout(acquire)
            .connect_with(Self::options(name))
            .await
            .unwrap()
    }

    pub(crate) async fn outbox(&self) -> Outbox {
        let outbox = Outbox::new(self.pool.clone());
        outbox.migrate().await.unwrap();
        outbox
    }

    /// Enqueues one `email` in a transaction of its own, committed.
    pub(crate) async fn enqueue(&self, outbox: &Outbox, key: &str, payload: &str) -> Enqueued {
        let mut tx = self.pool.begin().await.unwrap();
        let done = outbox
            .enqueue(&mut tx, "email", key, payload)
            .await
            .unwrap();
        tx.commit().await.unwrap();
        done
    }

    pub(crate) async fn scalar(&self, sql: &str) -> i64 {
        sqlx::query_scalar(sql).fetch_one(&self.pool).await.unwrap()
    }

    /// Kills every backend this schema's pools opened (as a Postgres restart or a failover
    /// would), from a connection of its own.
    pub(crate) async fn kill_connections(&self) -> i64 {
        let admin = PgPool::connect(&database_url()).await.unwrap();
        let n: i64 = sqlx::query_scalar(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE application_name = $1",
        )
        .bind(&self.name)
        .fetch_one(&admin)
        .await
        .unwrap();
        admin.close().await;
        n
    }
}

/// Counts sends per dedupe key.
#[derive(Clone, Default)]
pub(crate) struct Sent(Arc<Mutex<HashMap<String, usize>>>);

impl Sent {
    pub(crate) fn note(&self, m: &OutboxMessage) {
        *self
            .0
            .lock()
            .unwrap()
            .entry(m.dedupe_key().to_owned())
            .or_default() += 1;
    }

    pub(crate) fn of(&self, key: &str) -> usize {
        self.0.lock().unwrap().get(key).copied().unwrap_or(0)
    }

    pub(crate) fn total(&self) -> usize {
        self.0.lock().unwrap().values().sum()
    }

    pub(crate) fn keys_starting(&self, prefix: &str) -> usize {
        self.0
            .lock()
            .unwrap()
            .keys()
            .filter(|k| k.starts_with(prefix))
            .count()
    }

    /// A sender that never finishes a message whose key starts with `prefix` and notes every
    /// other one it sends.
    pub(crate) fn hanging_on(
        &self,
        prefix: &'static str,
    ) -> impl tower::Service<
        OutboxMessage,
        Response = (),
        Error = &'static str,
        Future: Send + 'static,
    > + Clone
           + Send
           + 'static {
        let sent = self.clone();
        tower::service_fn(move |m: OutboxMessage| {
            let hang = m.dedupe_key().starts_with(prefix);
            if !hang {
                sent.note(&m);
            }
            async move {
                if hang {
                    std::future::pending::<()>().await;
                }
                Ok(())
            }
        })
    }

    /// The most sends of any one key.
    pub(crate) fn max(&self) -> usize {
        self.0.lock().unwrap().values().copied().max().unwrap_or(0)
    }
}

/// A sender that fails its first send with `error`, sends every later one, and counts them all
/// in `calls`.
pub(crate) fn failing_first(
    calls: &Arc<std::sync::atomic::AtomicUsize>,
    error: &'static str,
) -> impl tower::Service<OutboxMessage, Response = (), Error = &'static str, Future: Send + 'static>
       + Clone
       + Send
       + 'static {
    let calls = Arc::clone(calls);
    tower::service_fn(move |_m: OutboxMessage| {
        let n = calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        async move {
            if n == 0 {
                Err(error)
            } else {
                Ok(())
            }
        }
    })
}

/// A 1 s lease (sends cut at 800 ms) and a 1 ms backoff: failed rows are due again at once.
pub(crate) fn quick() -> RelayConfig {
    RelayConfig::new()
        .lease(Duration::from_secs(1))
        .send_timeout(Duration::from_millis(800))
        .backoff(Backoff::new(Duration::from_millis(1), 1.0, Duration::from_millis(1)).unwrap())
}

/// Whether `check` holds within `limit`, checked every 20 ms.
pub(crate) async fn within(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let started = Instant::now();
    while started.elapsed() < limit {
        if check() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    check()
}

/// A relay's `run` on a task of its own, until `stop`.
pub(crate) struct Running<T> {
    stop: oneshot::Sender<()>,
    task: JoinHandle<T>,
}

impl<T: Send + 'static> Running<T> {
    /// Spawns `run(shutdown)`, where `shutdown` completes when [`stop`](Self::stop) is called.
    pub(crate) fn start<F>(run: impl FnOnce(oneshot::Receiver<()>) -> F) -> Self
    where
        F: Future<Output = T> + Send + 'static,
    {
        let (stop, stopped) = oneshot::channel();
        Self {
            stop,
            task: tokio::spawn(run(stopped)),
        }
    }

    /// Asks the run to stop and returns what it returned: within 5 s, without a panic.
    pub(crate) async fn stop(self) -> T {
        let _ = self.stop.send(());
        tokio::time::timeout(Duration::from_secs(5), self.task)
            .await
            .expect("the run stops within 5 s")
            .expect("the run must not panic")
    }

    /// Asks the run to stop and waits up to 5 s for it, whatever it ends with (for tests whose
    /// assertion is about something else).
    pub(crate) async fn stop_ignoring_outcome(self) {
        let _ = self.stop.send(());
        let _ = tokio::time::timeout(Duration::from_secs(5), self.task).await;
    }
}

/// A database of its own on the machine's PostgreSQL (`PG_URL`, a server URL; default
/// `postgres://postgres@127.0.0.1:5432`), created for one test and dropped (with `psql`, so it
/// happens even after a panic) when this is dropped, and a pool on it.
pub(crate) struct Database {
    // First: the database is dropped before the pool closes.
    _database: postgres::Database,
    pub(crate) name: String,
    pub(crate) pool: PgPool,
}

impl Database {
    pub(crate) async fn new() -> Self {
        let database = postgres::Database::create();
        let pool = PgPoolOptions::new()
            .max_connections(8)
            .connect(&database.url())
            .await
            .unwrap();
        Self {
            name: database.name.clone(),
            _database: database,
            pool,
        }
    }

    pub(crate) async fn outbox(&self) -> Outbox {
        let outbox = Outbox::new(self.pool.clone());
        outbox.migrate().await.unwrap();
        outbox
    }
}
