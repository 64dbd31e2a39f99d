//! Outbox rows delivered per second, end to end (claim → send → record), with 1 and 4 relays,
//! beside a seed-style relay (one transaction per batch: `FOR UPDATE SKIP LOCKED`, send every
//! row while holding the row locks, mark them sent, commit) on the same table in the same run.
//! The sender does nothing (0 ms) or stands for a provider that takes 5 ms. Rates are medians of
//! 3 interleaved rounds; the ratio divides the medians.
//!
//! ```sh
//! cargo bench --bench outbox --features outbox          # ROWS=2000 by default
//! ```
//!
//! Needs the PostgreSQL at `PG_URL` (default `postgres://postgres@127.0.0.1:5432`): it creates
//! a database of its own and drops it at the end.

#[path = "support/report.rs"]
mod report;

use report::{median, Table};
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tower_once::outbox::{sqlx, Outbox, OutboxMessage, OutboxRelay, RelayConfig};
use tower_once_test_support::postgres::Database;

async fn fill(pool: &PgPool, outbox: &Outbox, rows: usize) {
    sqlx::query("TRUNCATE outbox").execute(pool).await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    for i in 0..rows {
        outbox
            .enqueue(
                &mut tx,
                "email",
                &format!("k{i}"),
                r#"{"to":"a@example.com"}"#,
            )
            .await
            .unwrap();
    }
    tx.commit().await.unwrap();
}

async fn sent(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM outbox WHERE sent_at IS NOT NULL")
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn send(delay: Duration) {
    if delay.is_zero() {
        tokio::task::yield_now().await;
    } else {
        tokio::time::sleep(delay).await;
    }
}

/// tower-once's relays: rows per second.
async fn ours(pool: &PgPool, outbox: &Outbox, rows: usize, relays: usize, delay: Duration) -> f64 {
    fill(pool, outbox, rows).await;
    let calls = Arc::new(AtomicUsize::new(0));
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..relays {
        let calls = calls.clone();
        let sender = tower::service_fn(move |_m: OutboxMessage| {
            calls.fetch_add(1, Ordering::Relaxed);
            async move {
                send(delay).await;
                Ok::<_, std::io::Error>(())
            }
        });
        let config = RelayConfig::new().poll_interval(Duration::from_millis(10));
        let relay = OutboxRelay::new(outbox.clone(), config, sender).unwrap();
        let mut stopped = stopped.clone();
        tasks.push(tokio::spawn(relay.run(async move {
            let _ = stopped.wait_for(|s| *s).await;
        })));
    }
    while sent(pool).await < rows as i64 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let secs = started.elapsed().as_secs_f64();
    let _ = stop.send(true);
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(calls.load(Ordering::Relaxed), rows, "every row sent once");
    rows as f64 / secs
}

/// The seeds' relay: row locks held across the sends, one transaction per batch.
async fn seed(pool: &PgPool, outbox: &Outbox, rows: usize, relays: usize, delay: Duration) -> f64 {
    fill(pool, outbox, rows).await;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..relays {
        let pool = pool.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                let mut tx = pool.begin().await.unwrap();
                let batch: Vec<(i64, Vec<u8>)> = sqlx::query_as(
                    "SELECT id, payload FROM outbox WHERE sent_at IS NULL ORDER BY id LIMIT 16 \
                     FOR UPDATE SKIP LOCKED",
                )
                .fetch_all(&mut *tx)
                .await
                .unwrap();
                if batch.is_empty() {
                    break;
                }
                let ids: Vec<i64> = batch.iter().map(|(id, _)| *id).collect();
                for _ in &batch {
                    send(delay).await;
                }
                sqlx::query("UPDATE outbox SET sent_at = now() WHERE id = ANY($1)")
                    .bind(&ids)
                    .execute(&mut *tx)
                    .await
                    .unwrap();
                tx.commit().await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let secs = started.elapsed().as_secs_f64();
    assert_eq!(sent(pool).await, rows as i64);
    rows as f64 / secs
}

#[tokio::main]
async fn main() {
    let rows: usize = std::env::var("ROWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let db = Database::create();
    let pool = PgPoolOptions::new()
        .max_connections(16)
        .connect(&db.url())
        .await
        .unwrap();
    let outbox = Outbox::new(pool.clone());
    outbox.migrate().await.unwrap();

    println!("outbox rows delivered per second, {rows} rows, median of 3 interleaved rounds");
    println!();
    let table = Table::new(&[
        "sender",
        "relays",
        "seed-style relay",
        "tower-once relay",
        "ratio",
    ]);
    for delay in [Duration::ZERO, Duration::from_millis(5)] {
        for relays in [1, 4] {
            let (mut s, mut o) = (Vec::new(), Vec::new());
            for _ in 0..3 {
                s.push(seed(&pool, &outbox, rows, relays, delay).await);
                o.push(ours(&pool, &outbox, rows, relays, delay).await);
            }
            let (s, o) = (median(s), median(o));
            table.row(&[
                format!("{} ms", delay.as_millis()),
                relays.to_string(),
                format!("{s:.0}"),
                format!("{o:.0}"),
                format!("{:.2}", o / s),
            ]);
        }
    }
    pool.close().await;
    drop(db);
}
