//! One transaction per fresh request ([`PostgresStore::transactional`]): the claim opens the
//! handler's transaction and takes the key's lock in it; the record is inserted completed in
//! that same transaction, so claim, effects and record commit together, and a crash or a
//! rollback frees the key at once.

use super::claim_transaction::{ClaimTransaction, Committed};
use super::row::decode_claim;
use super::slots::{Finish, Slot, Slots, Take};
use super::{millis, PostgresStore};
use crate::fingerprint::Fingerprint;
use crate::store::Settled;
use crate::store::{ClaimOutcome, ClaimToken, Completion, ExistingRecord, RecordState, StoreKey};
use sqlx::pool::PoolConnection;
use sqlx::postgres::PgTransactionManager;
use sqlx::{Executor, Postgres, TransactionManager};
use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

/// SQLSTATE of the lock function: another transaction holds the key's lock.
const BUSY: &str = "TO409";
/// SQLSTATE of the lock function: a live record committed since the first read.
const EXISTS: &str = "TO200";
/// How many times a claim reads again when a record committed between its read and its lock.
const TRIES: usize = 3;

/// A connection whose transaction is being opened: closed, not returned to the pool, if the
/// claim is dropped half-way (its transaction state would be unknown).
struct Opening(Option<PoolConnection<Postgres>>);

impl Drop for Opening {
    fn drop(&mut self) {
        if let Some(conn) = self.0.as_mut() {
            conn.close_on_drop();
        }
    }
}

impl PostgresStore {
    /// The transactional claim: a live record answers as it is; otherwise a transaction is
    /// opened with the key's lock and parked for the handler under `token`.
    pub(super) async fn claim_in_transaction(
        self,
        key: StoreKey,
        token: ClaimToken,
        fingerprint: Fingerprint,
        lease: Duration,
    ) -> Result<ClaimOutcome, sqlx::Error> {
        let queries = &self.shared.queries;
        for _ in 0..TRIES {
            let live = sqlx::query(&queries.live)
                .bind(key.as_bytes().as_slice())
                .fetch_optional(&self.pool)
                .await?;
            if let Some(row) = live {
                return decode_claim(&row).map_err(|e| sqlx::Error::Decode(Box::new(e)));
            }
            let mut opening = Opening(Some(self.pool.acquire().await?));
            let Some(conn) = opening.0.as_mut() else {
                unreachable!("just set")
            };
            let statement = self.begin_statement(&key, lease, conn.server_version_num());
            match PgTransactionManager::begin(conn, Some(statement)).await {
                Ok(()) => {
                    let Some(conn) = opening.0.take() else {
                        unreachable!("just set")
                    };
                    let slots: Arc<dyn Committed> = self.slots.clone();
                    let slots = Arc::downgrade(&slots);
                    let tx = ClaimTransaction::opened(conn, key, token, fingerprint, slots);
                    self.slots.park(key, token, tx, lease);
                    return Ok(ClaimOutcome::Claimed);
                }
                Err(error) => {
                    let code = error
                        .as_database_error()
                        .and_then(|e| e.code())
                        .map(Cow::into_owned);
                    if !matches!(code.as_deref(), Some(BUSY | EXISTS)) {
                        return Err(error);
                    }
                    // The lock function failed the transaction; sqlx does not know it opened
                    // one, so it is ended here before the connection goes back.
                    conn.execute("ROLLBACK").await?;
                    opening.0 = None;
                    if code.as_deref() == Some(BUSY) {
                        // NOTE: the request holding the key keeps no row until it commits, so
                        // there is no fingerprint to compare with: any body gets `409` while
                        // it runs (and `422` once its record committed, if it differs).
                        return Ok(ClaimOutcome::Existing(ExistingRecord {
                            fingerprint,
                            state: RecordState::InProgress {
                                lease_remaining: lease,
                            },
                        }));
                    }
                }
            }
        }
        Err(sqlx::Error::Protocol(
            "idempotency claim: a record committed under each of three tries".into(),
        ))
    }

    /// `BEGIN`, the idle bounds and the lock, as one simple query: one round trip. Every value
    /// is a number or hex digits, so nothing from the request is spliced into the SQL.
    fn begin_statement(
        &self,
        key: &StoreKey,
        lease: Duration,
        server: Option<u32>,
    ) -> Cow<'static, str> {
        let idle = millis(lease).min(i64::from(i32::MAX));
        // Postgres 14 and later notice a closed connection during a statement too.
        let check = if server.is_some_and(|v| v >= 140_000) {
            "SET LOCAL client_connection_check_interval = 50; "
        } else {
            ""
        };
        let hex: String = key.as_bytes().iter().map(|b| format!("{b:02x}")).collect();
        let mut first = [0u8; 8];
        first.copy_from_slice(&key.as_bytes()[..8]);
        // The key's first 64 bits (a hash already); the lock function mixes in the table.
        let lock = i64::from_be_bytes(first);
        Cow::Owned(format!(
            "BEGIN; SET LOCAL idle_in_transaction_session_timeout = {idle}; {check}\
             SELECT {}(decode('{hex}', 'hex'), {lock})",
            self.shared.queries.lock_function
        ))
    }

    /// The layer's renewal of a transactional claim: a parked transaction is kept alive on
    /// the database (one statement), one the handler holds is renewed here only.
    pub(super) async fn extend_in_transaction(
        self,
        key: StoreKey,
        token: ClaimToken,
        lease: Duration,
    ) -> Result<bool, sqlx::Error> {
        let Ok(parked) = self.slots.renew(key, token, lease) else {
            return Ok(false);
        };
        let Some(tx) = parked else {
            return Ok(true);
        };
        // NOTE: on a task of its own, so that it ends (and gives the transaction back) even when
        // the layer stops polling this renewal to complete or release the claim, which waits
        // for the transaction to come back.
        let slots = Arc::clone(&self.slots);
        let kept = tokio::spawn(async move {
            let mut back = GiveBack {
                slots,
                token,
                tx: Some(tx),
            };
            let kept = match back.tx.as_mut() {
                Some(tx) => tx.keep_alive().await,
                None => Ok(()),
            };
            if kept.is_err() {
                // The connection failed: the transaction, and the key's lock, are gone.
                if let Some(tx) = back.tx.as_mut() {
                    tx.mark_broken();
                }
            }
            kept
        })
        .await;
        match kept {
            Ok(kept) => kept.map(|()| true),
            Err(error) => Err(sqlx::Error::Protocol(format!(
                "idempotency lease renewal: {error}"
            ))),
        }
    }

    /// The layer's completion of a transactional claim.
    pub(super) async fn complete_in_transaction(
        self,
        key: StoreKey,
        token: ClaimToken,
        completion: Completion,
        retention: Duration,
    ) -> Result<bool, sqlx::Error> {
        match self.finish_slot(key, token).await {
            // The handler did not take the transaction: the record commits alone, under the
            // lock it held while the handler ran.
            Some(Slot::Parked(tx)) => tx.record_and_commit(&self, &completion, retention).await,
            Some(Slot::Committed) => Ok(true),
            Some(Slot::Taken | Slot::Renewing) => {
                tracing::warn!("the handler still holds its claim's transaction: the layer records nothing; its own commit decides");
                Ok(false)
            }
            Some(Slot::RolledBack(ended)) => {
                if let Some(ended) = ended {
                    let _ = ended.await;
                }
                tracing::warn!("the handler took its claim's transaction and dropped it without Claim::commit: its effects rolled back and nothing is stored, so a retry runs it again");
                Ok(false)
            }
            None => Ok(false),
        }
    }

    /// The layer's release of a transactional claim: an untaken transaction rolls back, one
    /// its handler dropped is waited for; either way the key is free when this returns.
    pub(super) async fn release_in_transaction(self, key: StoreKey, token: ClaimToken) -> bool {
        match self.finish_slot(key, token).await {
            Some(Slot::Parked(tx)) => {
                tx.rollback().await;
                true
            }
            Some(Slot::RolledBack(ended)) => {
                if let Some(ended) = ended {
                    let _ = ended.await;
                }
                true
            }
            Some(Slot::Taken | Slot::Renewing) => true,
            Some(Slot::Committed) | None => false,
        }
    }
}

/// A parked transaction out for renewal, given back to its slot when this is dropped.
struct GiveBack {
    slots: Arc<Slots>,
    token: ClaimToken,
    tx: Option<ClaimTransaction>,
}

impl Drop for GiveBack {
    fn drop(&mut self) {
        if let Some(tx) = self.tx.take() {
            if tx.is_taken() {
                // Failed or cut short: closed, and its slot marked rolled back.
                drop(tx);
            } else {
                self.slots.renewed(self.token, tx);
            }
        }
    }
}

impl PostgresStore {
    /// Removes the claim's entry, once no renewal has its transaction out.
    async fn finish_slot(&self, key: StoreKey, token: ClaimToken) -> Option<Slot> {
        loop {
            let changed = self.slots.changed();
            tokio::pin!(changed);
            changed.as_mut().enable();
            match self.slots.finish(key, token) {
                Finish::Done(slot) => return slot,
                Finish::Renewing => changed.await,
            }
        }
    }

    /// The transaction of the claim `token`, for its handler: waits while a renewal has it out.
    pub(crate) async fn take_transaction(&self, token: ClaimToken) -> Option<ClaimTransaction> {
        loop {
            let changed = self.slots.changed();
            tokio::pin!(changed);
            changed.as_mut().enable();
            match self.slots.take(token) {
                Take::Took(tx) => return Some(tx.into_taken()),
                Take::Renewing => changed.await,
                Take::Gone => return None,
            }
        }
    }
}

impl PostgresStore {
    /// What the handler did with the transaction of the claim `token` (for a job's check).
    pub(crate) fn transaction_settled(&self, token: ClaimToken) -> Settled {
        self.slots.settled(token)
    }
}

impl Committed for Slots {
    fn committed(&self, token: ClaimToken) {
        Slots::committed(self, token);
    }

    fn rolled_back(&self, token: ClaimToken) -> Option<tokio::sync::oneshot::Sender<()>> {
        Slots::rolled_back(self, token)
    }
}
