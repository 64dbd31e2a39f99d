//! Attacks on `PostgresStore::transactional()`: each test states the guarantee it checks.
//! Tests that fail show a break; the report (attack branch) says which pass.
#![cfg(feature = "postgres")]

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;
use tower_once_idempotency::store::postgres::{sqlx, PostgresStore};
use tower_once_idempotency::{Claim, ClaimError, IdempotencyLayer};

mod support;

use support::{charge_through, ChargesDb};

async fn insert_charge(schema: &str, conn: &mut sqlx::PgConnection) -> Result<(), ClaimError> {
    sqlx::query(&format!("INSERT INTO {schema}.charges (amount) VALUES (5)"))
        .execute(conn)
        .await?;
    Ok(())
}

/// Advisory locks held by anyone right now (a leaked key lock shows here).
async fn advisory_locks(db: &ChargesDb) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'")
        .fetch_one(db.pool())
        .await
        .unwrap()
}

// ---------------------------------------------------------------------------------------------
// The store's conformance suite against a transactional store (real clock, 1 s lease).
// ---------------------------------------------------------------------------------------------

mod conformance {
    use super::*;
    use tower_once_idempotency::store::conformance::{RealClock, Suite};

    async fn suite() -> (ChargesDb, Suite<PostgresStore, RealClock>) {
        let db = ChargesDb::new().await;
        let store = db.store.clone().transactional();
        let suite = Suite::new(store, RealClock)
            .durations(Duration::from_millis(1000), Duration::from_millis(2000))
            .concurrency(16);
        (db, suite)
    }

    #[tokio::test]
    async fn rule1_claim_is_exclusive() {
        let (_db, s) = suite().await;
        s.claim_is_exclusive().await;
    }
    #[tokio::test]
    async fn rule1_concurrent_claims_have_one_winner() {
        let (_db, s) = suite().await;
        s.concurrent_claims_have_one_winner().await;
    }
    #[tokio::test]
    async fn rule3_complete_round_trips_the_response() {
        let (_db, s) = suite().await;
        s.complete_round_trips_the_response().await;
    }
    #[tokio::test]
    async fn rule3_not_replayable_is_kept() {
        let (_db, s) = suite().await;
        s.not_replayable_is_kept().await;
    }
    #[tokio::test]
    async fn rule2_writes_are_fenced_by_token() {
        let (_db, s) = suite().await;
        s.writes_are_fenced_by_token().await;
    }
    #[tokio::test]
    async fn rule2_completed_records_cannot_be_released_or_extended() {
        let (_db, s) = suite().await;
        s.completed_records_cannot_be_released_or_extended().await;
    }
    #[tokio::test]
    async fn release_frees_the_key() {
        let (_db, s) = suite().await;
        s.release_frees_the_key().await;
    }
    #[tokio::test]
    async fn rule4_extend_renews_the_lease() {
        let (_db, s) = suite().await;
        s.extend_renews_the_lease().await;
    }
    #[tokio::test]
    async fn rule4_lease_expiry_frees_the_key_and_fences_the_old_owner() {
        let (_db, s) = suite().await;
        s.lease_expiry_frees_the_key_and_fences_the_old_owner().await;
    }
    #[tokio::test]
    async fn rule4_retention_expiry_frees_the_key() {
        let (_db, s) = suite().await;
        s.retention_expiry_frees_the_key().await;
    }
    #[tokio::test]
    async fn keys_are_independent() {
        let (_db, s) = suite().await;
        s.keys_are_independent().await;
    }
}
