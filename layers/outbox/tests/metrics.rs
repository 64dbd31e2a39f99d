//! The outbox's `metrics` counter (crate docs, "Feature flags"; facade crate docs "Metrics"), with
//! a recording backend and a real PostgreSQL database of its own. One test in its own binary, as
//! the recorder is process-global.
#![cfg(feature = "metrics")]

use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use tower_once_outbox::classify::Action;
use tower_once_outbox::{sqlx, Outbox, OutboxMessage, OutboxRelay, RelayConfig};
use tower_once_test_support::postgres::Database;

#[tokio::test]
async fn the_relay_counts_sends_by_outcome_under_stable_names() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder
        .install()
        .expect("the only recorder in this binary");
    let db = Database::create();
    let pool = sqlx::PgPool::connect(&db.url()).await.unwrap();
    let outbox = Outbox::new(pool.clone());
    outbox.migrate().await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    for key in ["ok", "busy", "bad"] {
        outbox.enqueue(&mut tx, "email", key, "{}").await.unwrap();
    }
    tx.commit().await.unwrap();

    let sender = tower::service_fn(|m: OutboxMessage| async move {
        match m.dedupe_key() {
            "ok" => Ok(()),
            "busy" => Err("503"),
            _ => Err("400"),
        }
    });
    let relay = OutboxRelay::new(outbox, RelayConfig::new(), sender)
        .unwrap()
        .classify(|r: &Result<(), &str>| match r {
            Ok(()) => Action::Success,
            Err(e) if e.starts_with("400") => Action::Stop,
            Err(_) => Action::Retry { after: None },
        });
    let report = relay.pass().await.unwrap();
    assert_eq!((report.sent, report.failed, report.parked), (1, 1, 1));
    pool.close().await;

    let mut rows: Vec<(String, u64)> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter_map(|(key, _, _, value)| {
            let key = key.key();
            let labels: Vec<_> = key
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            match value {
                DebugValue::Counter(n) => {
                    Some((format!("{}{{{}}}", key.name(), labels.join(",")), n))
                }
                _ => None,
            }
        })
        .collect();
    rows.sort();
    assert_eq!(
        rows,
        [
            (
                "tower_once_outbox_sends_total{outcome=failed}".to_owned(),
                1
            ),
            (
                "tower_once_outbox_sends_total{outcome=parked}".to_owned(),
                1
            ),
            ("tower_once_outbox_sends_total{outcome=sent}".to_owned(), 1),
        ]
    );
}
