//! The outbox handle: migrate, enqueue in the caller's transaction, inspect, retry parked rows.

use crate::error::OutboxError;
use crate::message::{
    self, time_from_millis, Enqueued, OutboxStats, ParkedMessage, DEFAULT_MAX_PAYLOAD,
};
use crate::schema::{self, Queries, Table};
use bytes::Bytes;
use sqlx::{PgPool, Postgres, Row, Transaction};
use std::sync::Arc;

/// A transactional outbox in one Postgres table. Cheap to clone.
///
/// Write a message in the same transaction as the business change it announces, with
/// [`enqueue`](Self::enqueue): both commit or neither does. An [`OutboxRelay`](crate::OutboxRelay)
/// sends it afterwards, at least once, with its dedupe key as the provider's idempotency key.
#[derive(Debug, Clone)]
pub struct Outbox {
    pool: PgPool,
    queries: Arc<Queries>,
    max_payload: usize,
}

impl Outbox {
    /// The outbox in table `outbox` (in the connection's `search_path`).
    pub fn new(pool: PgPool) -> Self {
        Self {
            pool,
            queries: Arc::new(Queries::new(&Table::default())),
            max_payload: DEFAULT_MAX_PAYLOAD,
        }
    }

    /// Uses another table: `name` or `schema.name`, each part lowercase letters, digits and
    /// `_`, not starting with a digit, at most 48 bytes, and not a word Postgres reserves
    /// (`user`, `order`, ...). [`migrate`](Self::migrate) creates the table, not the schema.
    ///
    /// Fails, with [`OutboxError::is_config`], on any other name: it is written into SQL.
    pub fn table(mut self, name: &str) -> Result<Self, OutboxError> {
        self.queries = Arc::new(Queries::new(&Table::parse(name)?));
        Ok(self)
    }

    /// The largest payload [`enqueue`](Self::enqueue) accepts (default 1 MiB).
    pub fn max_payload(mut self, bytes: usize) -> Self {
        self.max_payload = bytes;
        self
    }

    /// The pool the outbox reads and writes through.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The table's name as written in queries.
    pub fn table_name(&self) -> &str {
        &self.queries.table
    }

    /// The statements [`migrate`](Self::migrate) runs, for this table's name: for your own
    /// migrations when the table is not called `outbox` (the shipped
    /// `migrations/0001_outbox.sql` is this for the default name).
    pub fn migration_sql(&self) -> &str {
        &self.queries.migrate
    }

    pub(crate) fn queries(&self) -> &Queries {
        &self.queries
    }

    /// Creates the table, its indexes and its `NOTIFY` trigger if they are missing (the
    /// statements of `migrations/0001_outbox.sql`, for this table's name). Safe to call from
    /// every process at start: one runs at a time. Needs PostgreSQL 14 or later.
    pub async fn migrate(&self) -> Result<(), OutboxError> {
        schema::migrate(&self.pool, &self.queries).await
    }

    /// Writes a message in the caller's transaction: it is sent once that transaction commits,
    /// and never if it rolls back.
    ///
    /// The same `dedupe_key` with the same topic and payload is written once
    /// ([`Enqueued::Duplicate`]), so a handler that runs twice sends once; with another topic
    /// or payload it fails with [`OutboxError::is_key_reused`] and writes nothing. A key that
    /// is not 1 to 255 visible ASCII characters, an empty topic or a payload over
    /// [`max_payload`](Self::max_payload) fails with [`OutboxError::is_invalid`] before
    /// reaching Postgres. The transaction stays usable after any of these errors.
    ///
    /// A `Duplicate` may wait for a concurrent transaction that wrote the same key to finish
    /// (Postgres's unique index does that), and becomes `New` if that one rolls back.
    pub async fn enqueue(
        &self,
        tx: &mut Transaction<'_, Postgres>,
        topic: &str,
        dedupe_key: &str,
        payload: impl AsRef<[u8]>,
    ) -> Result<Enqueued, OutboxError> {
        let payload = payload.as_ref();
        message::check(topic, dedupe_key, payload, self.max_payload)?;
        let inserted: Option<i64> = sqlx::query_scalar(&self.queries.enqueue)
            .bind(topic)
            .bind(dedupe_key)
            .bind(payload)
            .fetch_optional(&mut **tx)
            .await?;
        if let Some(id) = inserted {
            return Ok(Enqueued::New(id));
        }
        let existing: Option<(i64, bool)> = sqlx::query_as(&self.queries.existing)
            .bind(dedupe_key)
            .bind(topic)
            .bind(payload)
            .fetch_optional(&mut **tx)
            .await?;
        match existing {
            Some((id, true)) => Ok(Enqueued::Duplicate(id)),
            Some((_, false)) => Err(OutboxError::key_reused()),
            // Purged between the two statements: vanishingly rare; the caller retries.
            None => Err(OutboxError::key_reused()),
        }
    }

    /// Rows parked for a person, oldest first, at most `limit`.
    pub async fn parked(&self, limit: u32) -> Result<Vec<ParkedMessage>, OutboxError> {
        let rows = sqlx::query(&self.queries.parked)
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|row| {
                Ok(ParkedMessage {
                    id: row.try_get(0)?,
                    topic: row.try_get(1)?,
                    dedupe_key: row.try_get(2)?,
                    payload: Bytes::from(row.try_get::<Vec<u8>, _>(3)?),
                    attempts: u32::try_from(row.try_get::<i32, _>(4)?).unwrap_or(0),
                    last_error: row.try_get(5)?,
                    created_at: time_from_millis(row.try_get(6)?),
                    parked_at: time_from_millis(row.try_get(7)?),
                })
            })
            .collect()
    }

    /// Sends a parked row again: its attempts start over and a relay picks it up at once.
    /// `false` when no parked row has that id.
    pub async fn retry_parked(&self, id: i64) -> Result<bool, OutboxError> {
        let done = sqlx::query(&self.queries.retry_parked)
            .bind(id)
            .execute(&self.pool)
            .await?;
        if done.rows_affected() != 1 {
            return Ok(false);
        }
        // Only inserts fire the trigger: wake running relays for this row too.
        sqlx::query(&self.queries.notify)
            .execute(&self.pool)
            .await?;
        Ok(true)
    }

    /// Row counts by state.
    pub async fn stats(&self) -> Result<OutboxStats, OutboxError> {
        let (pending, leased, parked, sent): (i64, i64, i64, i64) =
            sqlx::query_as(&self.queries.stats)
                .fetch_one(&self.pool)
                .await?;
        let n = |v: i64| u64::try_from(v).unwrap_or(0);
        Ok(OutboxStats {
            pending: n(pending),
            leased: n(leased),
            parked: n(parked),
            sent: n(sent),
        })
    }
}
