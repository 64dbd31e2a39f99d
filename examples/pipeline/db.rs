//! Postgres: the pool and the `summaries` table.

use tower_once::outbox::sqlx::{self, PgPool};
use tower_once::outbox::Outbox;
use tower_once::worker::BoxError;

/// Connects and creates what the role needs: `summaries` always, the outbox if asked.
pub(crate) async fn connect(url: &str, outbox: bool) -> Result<(PgPool, Outbox), BoxError> {
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(16)
        .acquire_timeout(std::time::Duration::from_secs(5))
        .connect(url)
        .await?;
    let mut tx = pool.begin().await?;
    // Several roles start at once: one creates, the others wait (any fixed key works).
    sqlx::query("SELECT pg_advisory_xact_lock(4242001)")
        .execute(&mut *tx)
        .await?;
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS summaries (
            job_id     TEXT PRIMARY KEY,
            tenant     TEXT NOT NULL,
            summary    TEXT NOT NULL,
            notify     TEXT NOT NULL,
            created_at TIMESTAMPTZ NOT NULL DEFAULT now()
        )",
    )
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    let outbox_handle = Outbox::new(pool.clone());
    if outbox {
        outbox_handle.migrate().await?;
    }
    Ok((pool, outbox_handle))
}
