//! The transaction a transactional claim hands its handler: the effects and the record commit
//! on it together, and dropped it is rolled back (or its connection closed) on a task.

use super::{completion_statement, PostgresStore};
use crate::fingerprint::Fingerprint;
use crate::store::{ClaimToken, Completion, StoreKey};
use sqlx::pool::PoolConnection;
use sqlx::postgres::PgTransactionManager;
use sqlx::{Executor, PgConnection, Postgres, TransactionManager};
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::Weak;
use std::time::Duration;

/// The transaction a transactional claim opened for the handler, holding the key's lock:
/// write your effects on it (`&mut *tx` is a `&mut PgConnection`, as with a
/// `sqlx::Transaction`) and finish it with [`Claim::commit`](crate::Claim::commit), which
/// writes the record and commits, in one transaction with your effects.
///
/// It has no `commit` of its own, so that effects never commit without their record. Dropped
/// without [`Claim::commit`](crate::Claim::commit) (an error returned with `?`, a panic, a
/// cancelled request), it is rolled back on a task (its connection closed if a statement is
/// still running): the effects and the lock go, the layer answers once they have, and a retry
/// runs the handler again at once.
/// Savepoints work as on any connection (`sqlx::Acquire::begin(&mut *tx)`).
pub struct ClaimTransaction {
    // `Some` until the transaction ends (its drop takes it to end it on a task).
    conn: Option<PoolConnection<Postgres>>,
    key: StoreKey,
    token: ClaimToken,
    fingerprint: Fingerprint,
    slots: Weak<dyn Committed>,
    open: bool,
    // In the handler's hands: dropped open, a statement may still be running on it.
    taken: bool,
}

impl fmt::Debug for ClaimTransaction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClaimTransaction")
            .field("key", &self.key)
            .field("token", &self.token)
            .field("open", &self.open)
            .finish_non_exhaustive()
    }
}

impl Deref for ClaimTransaction {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        match &self.conn {
            Some(conn) => conn,
            None => unreachable!("a transaction's connection is taken only as it ends"),
        }
    }
}

impl DerefMut for ClaimTransaction {
    fn deref_mut(&mut self) -> &mut PgConnection {
        match &mut self.conn {
            Some(conn) => conn,
            None => unreachable!("a transaction's connection is taken only as it ends"),
        }
    }
}

impl Drop for ClaimTransaction {
    fn drop(&mut self) {
        let Some(mut conn) = self.conn.take() else {
            return;
        };
        if !self.open {
            return;
        }
        if !self.taken {
            // Queued, sent with the connection's next use (the pool's check on its return),
            // as `sqlx::Transaction` does; the lock goes with it. (The layer's own release
            // rolls back with `rollback` instead, and waits for it.)
            PgTransactionManager::start_rollback(&mut conn);
            return;
        }
        // NOTE: dropped by its handler (an error, a panic, a cancelled or timed-out request),
        // maybe with a statement still running. It is ended on a task, and the layer's release
        // waits for that before the client is answered, so that a retry sent on the answer
        // finds the key free: a rollback, or, when a statement still runs on the connection,
        // closing it (Postgres 14 and later notice within `client_connection_check_interval`).
        let ended = self.slots.upgrade().and_then(|s| s.rolled_back(self.token));
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    end(conn).await;
                    if let Some(ended) = ended {
                        let _ = ended.send(());
                    }
                });
            }
            Err(_) => conn.close_on_drop(),
        }
    }
}

/// How long a dropped transaction's rollback may wait for a statement still running on its
/// connection before the connection is closed instead.
const ROLLBACK_WAIT: Duration = Duration::from_millis(50);

/// Ends a transaction its handler dropped: rolled back, or its connection closed.
async fn end(mut conn: PoolConnection<Postgres>) {
    match tokio::time::timeout(ROLLBACK_WAIT, PgTransactionManager::rollback(&mut conn)).await {
        Ok(Ok(())) => {}
        _ => {
            let _ = conn.close().await;
        }
    }
}

/// Told how a claim's transaction ended (the store's open claims).
pub(super) trait Committed: Send + Sync {
    /// It committed.
    fn committed(&self, token: ClaimToken);
    /// Its handler dropped it: the sender says when its rollback is done.
    fn rolled_back(&self, token: ClaimToken) -> Option<tokio::sync::oneshot::Sender<()>>;
}

impl ClaimTransaction {
    /// A transaction just opened with the key's lock, parked until its handler takes it.
    pub(super) fn opened(
        conn: PoolConnection<Postgres>,
        key: StoreKey,
        token: ClaimToken,
        fingerprint: Fingerprint,
        slots: Weak<dyn Committed>,
    ) -> Self {
        Self {
            conn: Some(conn),
            key,
            token,
            fingerprint,
            slots,
            open: true,
            taken: false,
        }
    }

    /// Whether its drop must close it (in a handler's hands, or its connection failed).
    pub(super) fn is_taken(&self) -> bool {
        self.taken
    }

    /// Its connection failed: its drop closes it rather than parking it again.
    pub(super) fn mark_broken(&mut self) {
        self.taken = true;
    }

    pub(crate) fn token(&self) -> ClaimToken {
        self.token
    }

    /// Handed to the handler.
    pub(super) fn into_taken(mut self) -> Self {
        self.taken = true;
        self
    }

    /// One statement, so that Postgres does not count the transaction idle (its idle bound is
    /// the lease, renewed this way while the handler runs without it).
    pub(super) async fn keep_alive(&mut self) -> Result<(), sqlx::Error> {
        (**self).execute("SELECT 1").await.map(drop)
    }

    /// Rolls back now (the layer's release: it answers once the key is free).
    pub(super) async fn rollback(mut self) {
        let Some(mut conn) = self.conn.take() else {
            return;
        };
        self.open = false;
        if PgTransactionManager::rollback(&mut conn).await.is_err() {
            let _ = conn.close().await;
        }
    }

    /// Inserts the completed record and commits. `Ok(false)`: a live record of another claim
    /// holds the key (it was written without the lock), and nothing committed.
    pub(crate) async fn record_and_commit(
        mut self,
        store: &PostgresStore,
        completion: &Completion,
        retention: Duration,
    ) -> Result<bool, sqlx::Error> {
        let query = &store.shared.queries.record;
        let (key, fingerprint) = (self.key, self.fingerprint);
        let inserted = completion_statement(query, &key, self.token, completion, retention)
            .bind(fingerprint.as_bytes().as_slice())
            .execute(&mut *self)
            .await?
            .rows_affected();
        if inserted != 1 {
            return Ok(false);
        }
        self.commit().await?;
        Ok(true)
    }

    /// Commits what the handler wrote, without a record.
    pub(crate) async fn commit(mut self) -> Result<(), sqlx::Error> {
        // NOTE: open until the commit succeeded, as `sqlx::Transaction` does: a failed (or
        // dropped) commit leaves sqlx counting a transaction on the connection, and the drop's
        // queued rollback ends that count, so the pooled connection begins cleanly next time.
        PgTransactionManager::commit(&mut self).await?;
        self.open = false;
        if let Some(slots) = self.slots.upgrade() {
            slots.committed(self.token);
        }
        Ok(())
    }
}
