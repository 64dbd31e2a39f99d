//! The Postgres store (feature `postgres`): records in one table of your database, so that a
//! handler whose effects are in the same database can commit its record with them, in its own
//! transaction (see [`Claim`](crate::Claim)).
//!
//! ```no_run
//! use tower_once_idempotency::store::postgres::PostgresStore;
//! use tower_once_idempotency::IdempotencyLayer;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let store = PostgresStore::connect("postgres://127.0.0.1/app").await?;
//! store.migrate().await?; // or run `store.migration()` with your own migrations
//! let layer = IdempotencyLayer::with_store(store);
//! # let _ = layer;
//! # Ok(())
//! # }
//! ```
//!
//! # How records are kept
//!
//! One row per key in the table `idempotency_records` (another name with
//! [`table`](PostgresStore::table)): the 32-byte store key as the primary key, the claim's
//! token, the state (`in_progress`, `completed`, `not_replayable`), the fingerprint, the
//! expiry (`expires_at`: the lease's end while in progress, the retention's once completed)
//! and, once completed, the status, the headers and trailers as parallel arrays of names and
//! values, and the body. The schema is shipped as SQL ([`migration`](PostgresStore::migration));
//! [`migrate`](PostgresStore::migrate) runs it under an advisory lock. Besides the table it
//! creates two functions, `{table}_claim` and `{table}_lock` (the transactional claim's).
//!
//! Each operation is one statement, so one round trip: the claim calls the table's
//! `{table}_claim` function (return a live record as it is, read-only, so that a replay or a
//! duplicate writes nothing and waits for no lock; otherwise claim the key, looping if the row
//! changes between the two), and `complete`, `release` and
//! `extend` are single statements fenced by the token, the state and the lease. Time is the
//! database's clock (`clock_timestamp()`), so every replica agrees on when a lease ends. A
//! request through the layer therefore costs: fresh 2 round trips (claim, complete), or, when
//! the handler completes its claim in its own transaction, the claim, that transaction and one
//! read-only statement after it (whether the record committed: the layer checks the record,
//! not the response); replay 1, conflict 1, mismatch 1.
//!
//! Expired rows count as absent at once and are deleted by later claims: one fresh claim in
//! eight deletes up to sixteen expired rows (through the `expires_at` index, skipping rows
//! others hold),
//! so they cannot pile up while keys keep arriving, and no statement on the request path scans
//! the table. [`purge_expired`](PostgresStore::purge_expired) deletes a batch on demand.
//!
//! Each statement the store runs on its pool is bounded by a timeout (default 1 s), waiting for
//! a pooled connection included (the completion a handler runs in its own transaction is bounded
//! by that transaction's settings); a claim of an expired record that a handler's open
//! transaction holds locked also waits on the server at most that long, so a claim the layer
//! gave up on does not keep its connection busy until that commit. A statement that times out
//! or fails (Postgres down or restarting, a backend killed, the table dropped, the pool exhausted) turns into a [`StoreError`] that names the
//! cause, and the layer answers `503` without running the handler; the pool replaces broken
//! connections on its own, so requests succeed again once Postgres is back.
//!
//! # One transaction per fresh request
//!
//! With [`transactional`](PostgresStore::transactional), the claim of a key with no live
//! record opens the handler's transaction instead of writing a row: `BEGIN`, the transaction's
//! idle bound and the key's lock (a transaction-scoped advisory lock, and a second look for a
//! record that committed meanwhile), in one round trip. The handler takes that transaction
//! ([`Claim::transaction`](crate::Claim::transaction)), writes its effects on it, and
//! [`Claim::commit`](crate::Claim::commit) inserts the completed record (by the layer's
//! rules) and commits. So:
//!
//! - **One commit** for the claim, the effects and the record: a fresh request is the read of
//!   a live record, the handler's statements, the record's insert and `COMMIT` (a test counts
//!   them); a replay is still one read-only statement.
//! - **No lease to wait out.** A rollback, an error returned before the commit, a panic, a
//!   killed connection or a crashed process ends the transaction, and its lock with it: the
//!   client's retry runs the handler at once. Nothing of a failed attempt is ever stored.
//! - **A duplicate gets `409` at once** while the first transaction is open (its lock is
//!   tried, never waited for). The transaction keeps no row until it commits, so while it
//!   runs a request with the same key gets `409` whatever its body; once committed, a
//!   different body gets `422` as usual.
//! - **A frozen owner is bounded by the database.** The transaction's
//!   `idle_in_transaction_session_timeout` is the layer's lease (10 s by default), and the
//!   layer renews it while the handler runs without taking the transaction (one `SELECT 1` on
//!   it per renewal, a third of the lease apart). An owner that stops (a paused VM, a
//!   `SIGSTOP`) has its session ended by Postgres once a lease passes, the key is free, and
//!   the owner can never commit afterwards. A handler that took the transaction may stay
//!   idle in it at most a lease between its statements: keep slow calls to other services
//!   out of it, or raise the lease.
//! - **A dropped transaction frees the key at once**, even with a statement running on it: it
//!   is rolled back on a task (its connection closed instead when a statement still runs
//!   after 50 ms; on Postgres 14 and later the session checks its client every 50 ms during a
//!   statement), and the layer answers the request only once that is done, so a retry sent on
//!   the answer finds the key free.
//! - **Isolation** is the session's default (`READ COMMITTED` unless configured): the
//!   transaction has begun before the handler runs, so set another level on the pool's
//!   connections (`default_transaction_isolation`). At `REPEATABLE READ` and above the lock
//!   function also probes the primary key (an insert undone with its subtransaction), since
//!   the transaction's snapshot predates the lock. A serialization failure fails
//!   `Claim::commit` ([`ClaimError::is_store`](crate::ClaimError::is_store)), nothing is
//!   stored, and the retry runs the handler again.
//! - **Costs**: each claimed request holds a pooled connection from its claim to its commit,
//!   so size the pool for the keyed requests in flight: with none free, a request (a
//!   duplicate included) waits for one up to the store's timeout and gets `503`. A handler
//!   that never takes the transaction is recorded by the layer on it, still one commit (its
//!   effects elsewhere are as safe as with the other stores). A handler that takes the
//!   transaction, drops it and answers success is answered as it says, with nothing stored:
//!   a retry runs it again.
//!
//! Use one mode per table: a transactional store's claims do not see another mode's locks,
//! only its rows (a live row written by the other mode makes `Claim::commit` fail with
//! [`ClaimError::is_lost`](crate::ClaimError::is_lost), so nothing commits twice). The
//! advisory lock is the key's first 64 bits mixed with the table's oid (one lock space per
//! table, whatever name reaches it); an application's own advisory locks can collide with it
//! only by chance (1 in 2⁶⁴ per pair held at once), which would answer a `409`. The store's
//! conformance suite passes but for one rule: a claim in flight keeps no row, so a duplicate
//! sees its own fingerprint.
//!
//! # Durability
//!
//! A record is as durable as any committed row: with Postgres's defaults (`fsync`,
//! `synchronous_commit = on`) a claim or completion that was answered survives a crash of the
//! database. An asynchronous replica promoted after a failover may lack the last commits, as
//! for any data of yours.

mod claim_transaction;
mod error;
mod handler_record;
mod operations;
mod row;
mod schema;
mod slots;
mod transactional;

pub use self::claim_transaction::ClaimTransaction;
pub(crate) use self::error::from_sqlx as sqlx_error;
pub(crate) use self::error::from_sqlx;
pub(crate) use self::handler_record::{CompletedOn, Transaction};
pub(crate) use self::operations::{completion_statement, millis};
pub use self::schema::DEFAULT_TABLE;

use self::schema::Queries;
use self::slots::Slots;
use super::{StoreError, StoreFuture};
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
pub use tower_once_core::table::{TableName, TableNameError};

/// The `sqlx` this store is built on, to make pools and transactions of the matching version.
pub use ::sqlx;

/// An [`IdempotencyStore`](super::IdempotencyStore) on a Postgres table. See the [module docs](self).
#[derive(Clone)]
pub struct PostgresStore {
    pool: PgPool,
    shared: Arc<Shared>,
    // The transactions transactional claims opened, waiting for their handlers.
    slots: Arc<Slots>,
}

struct Shared {
    table: TableName,
    queries: Queries,
    timeout: Duration,
    transactional: bool,
}

impl fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresStore")
            .field("table", &self.shared.queries.table)
            .field("timeout", &self.shared.timeout)
            .field("transactional", &self.shared.transactional)
            .finish_non_exhaustive()
    }
}

impl PostgresStore {
    /// A store on `pool`, in the table `idempotency_records`, with a 1 s statement timeout.
    pub fn new(pool: PgPool) -> Self {
        let table = default_table();
        Self {
            pool,
            shared: Arc::new(Shared {
                queries: Queries::new(&table),
                table,
                timeout: Duration::from_secs(1),
                transactional: false,
            }),
            slots: Arc::default(),
        }
    }

    /// A store on a pool of up to 10 connections to `url`, e.g. `postgres://127.0.0.1/app`.
    ///
    /// Connections are made when first needed and remade after a failure, so this succeeds
    /// while Postgres is still down (requests get `503` until it is up). Fails only on a
    /// malformed URL.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let timeout = Duration::from_secs(1);
        let pool = PgPoolOptions::new()
            .max_connections(10)
            .acquire_timeout(timeout)
            .connect_lazy(url)
            .map_err(from_sqlx)?;
        Ok(Self::new(pool))
    }

    /// Keeps the records in `name` (`table` or `schema.table`: lowercase ASCII letters,
    /// digits and `_`, not a reserved word). [`migrate`](Self::migrate) creates the table and
    /// its function, not the schema.
    pub fn table(self, name: &str) -> Result<Self, TableNameError> {
        let table = TableName::parse(name)?;
        Ok(self.map_shared(|shared| {
            shared.queries = Queries::new(&table);
            shared.table = table;
        }))
    }

    /// The longest a single statement may take, waiting for a connection included, before it
    /// fails with [`StoreError::timeout`]. Default 1 s.
    ///
    /// # Panics
    ///
    /// If `timeout` is zero.
    pub fn command_timeout(self, timeout: Duration) -> Self {
        assert!(
            !timeout.is_zero(),
            "PostgresStore::command_timeout must not be zero"
        );
        self.map_shared(|shared| shared.timeout = timeout)
    }

    /// One transaction per fresh request: each claim of an absent key opens the handler's
    /// transaction and takes the key's lock in it (a transaction-scoped advisory lock); the
    /// handler writes its effects on that transaction ([`Claim::transaction`](crate::Claim::transaction))
    /// and [`Claim::commit`](crate::Claim::commit) inserts the completed record and commits,
    /// so claim, effects and record are one commit. See the [module docs](self#one-transaction-per-fresh-request).
    ///
    /// Each claimed request holds a pooled connection, and a transaction, until its handler
    /// commits or returns: size the pool for the keyed requests in flight, and keep slow
    /// calls to other services out of such handlers (or use the default two-step claim).
    pub fn transactional(self) -> Self {
        self.map_shared(|shared| shared.transactional = true)
    }

    /// Whether claims open the handler's transaction ([`transactional`](Self::transactional)).
    pub fn is_transactional(&self) -> bool {
        self.shared.transactional
    }

    /// The SQL [`migrate`](Self::migrate) runs, for this store's table name: for your own
    /// migration tool.
    pub fn migration(&self) -> &str {
        &self.shared.queries.migrate
    }

    /// Creates the table, its index and its two functions (`{table}_claim`, `{table}_lock`) if
    /// missing: dropping the table alone leaves the functions. Safe to run from many
    /// processes at once (an advisory lock orders them) and on every start.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        schema::migrate(&self.pool, &self.shared.queries).await
    }

    /// Deletes up to `limit` expired records; returns how many. Claims already delete expired
    /// rows as they go, so this is only needed to shrink the table after a busy period.
    pub async fn purge_expired(&self, limit: u32) -> Result<u64, StoreError> {
        let done = sqlx::query(&self.shared.queries.purge)
            .bind(i64::from(limit))
            .execute(&self.pool)
            .await
            .map_err(from_sqlx)?;
        Ok(done.rows_affected())
    }

    /// The table's name, as written in statements.
    pub fn table_name(&self) -> &str {
        &self.shared.queries.table
    }

    /// The pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    fn map_shared(mut self, f: impl FnOnce(&mut Shared)) -> Self {
        let mut shared = Shared {
            table: self.shared.table.clone(),
            queries: Queries::new(&self.shared.table),
            timeout: self.shared.timeout,
            transactional: self.shared.transactional,
        };
        f(&mut shared);
        self.shared = Arc::new(shared);
        self
    }

    /// Runs `work` bounded by the statement timeout.
    fn bounded<T, Fut>(&self, work: impl FnOnce(PgPool, Arc<Shared>) -> Fut) -> StoreFuture<T>
    where
        Fut: Future<Output = Result<T, sqlx::Error>> + Send + 'static,
        T: Send + 'static,
    {
        let timeout = self.shared.timeout;
        let work = work(self.pool.clone(), Arc::clone(&self.shared));
        Box::pin(async move {
            match tokio::time::timeout(timeout, work).await {
                Ok(result) => result.map_err(from_sqlx),
                Err(_) => Err(StoreError::timeout()),
            }
        })
    }
}

fn default_table() -> TableName {
    TableName::parse(DEFAULT_TABLE).unwrap_or_else(|_| unreachable!("the default name is valid"))
}
