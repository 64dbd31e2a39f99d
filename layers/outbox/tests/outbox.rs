//! The outbox and its relay against the machine's PostgreSQL (`DATABASE_URL`, default
//! `postgres://postgres@127.0.0.1:5432/test`). Every test works in its own schema, dropped at
//! the end, so runs never see each other.

mod support;

use bytes::Bytes;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::{failing_first, quick, within, Running, Schema, Sent};
use tower::service_fn;
use tower_once_outbox::{Enqueued, Outbox, OutboxMessage, OutboxRelay, RelayConfig};
use tower_once_retry::classify::Action;

#[tokio::test]
async fn a_message_commits_with_the_transaction_and_is_sent_once() {
    let db = Schema::new().await;
    let outbox = db.outbox().await;

    // Rolled back: never sent.
    let mut tx = db.pool.begin().await.unwrap();
    outbox
        .enqueue(&mut tx, "email", "rolled-back", "{}")
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    assert!(matches!(
        db.enqueue(&outbox, "k1", "{\"a\":1}").await,
        Enqueued::New(_)
    ));

    let sent = Sent::default();
    let s = sent.clone();
    let relay = OutboxRelay::new(
        outbox.clone(),
        quick(),
        service_fn(move |m: OutboxMessage| {
            s.note(&m);
            let request = m.http_request("http://mailer.test/send").unwrap();
            assert_eq!(request.headers()["idempotency-key"], "k1");
            assert_eq!(request.body(), &Bytes::from_static(b"{\"a\":1}"));
            async { Ok::<_, std::io::Error>(()) }
        }),
    )
    .unwrap();
    let report = relay.pass().await.unwrap();
    assert_eq!((report.claimed, report.sent), (1, 1));
    assert_eq!(relay.pass().await.unwrap().claimed, 0);
    assert_eq!((sent.of("k1"), sent.of("rolled-back")), (1, 0));
    assert_eq!(
        db.scalar("SELECT count(*) FROM outbox WHERE sent_at IS NOT NULL")
            .await,
        1
    );
    let stats = outbox.stats().await.unwrap();
    assert_eq!((stats.pending, stats.sent, stats.parked), (0, 1, 0));
}

#[tokio::test]
async fn the_same_key_is_written_once_and_a_reused_key_is_refused() {
    let db = Schema::new().await;
    let outbox = db.outbox().await;
    let first = db.enqueue(&outbox, "job-7:mail", "{}").await;
    let again = db.enqueue(&outbox, "job-7:mail", "{}").await;
    assert_eq!(again, Enqueued::Duplicate(first.id()));

    let mut tx = db.pool.begin().await.unwrap();
    let reused = outbox
        .enqueue(&mut tx, "email", "job-7:mail", "{\"other\":1}")
        .await;
    assert!(reused.unwrap_err().is_key_reused());
    let other_topic = outbox.enqueue(&mut tx, "sms", "job-7:mail", "{}").await;
    assert!(other_topic.unwrap_err().is_key_reused());
    for bad in ["", "with space", "crlf\r\n", "ü"] {
        let err = outbox
            .enqueue(&mut tx, "email", bad, "{}")
            .await
            .unwrap_err();
        assert!(err.is_invalid(), "{bad:?}");
    }
    let huge = vec![0u8; tower_once_outbox::DEFAULT_MAX_PAYLOAD + 1];
    assert!(outbox
        .enqueue(&mut tx, "email", "big", huge)
        .await
        .unwrap_err()
        .is_invalid());
    // The transaction is still usable after every refusal.
    outbox
        .enqueue(&mut tx, "email", "after-errors", "{}")
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(db.scalar("SELECT count(*) FROM outbox").await, 2);
}

#[tokio::test]
async fn a_provider_that_is_down_is_retried_then_sent_on_the_next_pass() {
    let db = Schema::new().await;
    let outbox = db.outbox().await;
    db.enqueue(&outbox, "k", "{}").await;
    let up = Arc::new(AtomicUsize::new(0));
    let calls = Arc::new(AtomicUsize::new(0));
    let (u, c) = (up.clone(), calls.clone());
    let relay = OutboxRelay::new(
        outbox.clone(),
        quick(),
        service_fn(move |_m: OutboxMessage| {
            c.fetch_add(1, Ordering::SeqCst);
            let result = if u.load(Ordering::SeqCst) == 1 {
                Ok(())
            } else {
                Err("connection refused")
            };
            async move { result }
        }),
    )
    .unwrap();
    let first = relay.pass().await.unwrap();
    assert_eq!((first.claimed, first.failed), (1, 1));
    assert_eq!(db.scalar("SELECT attempts::int8 FROM outbox").await, 1);
    let error: String = sqlx::query_scalar("SELECT last_error FROM outbox")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(error, "connection refused");
    up.store(1, Ordering::SeqCst);
    // The backoff is a millisecond: the next pass finds it due.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let second = relay.pass().await.unwrap();
    assert_eq!(second.sent, 1);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert_eq!(db.scalar("SELECT attempts::int8 FROM outbox").await, 1);
}

#[tokio::test]
async fn a_permanent_failure_parks_after_one_call_and_a_person_can_retry_it() {
    let db = Schema::new().await;
    let outbox = db.outbox().await;
    db.enqueue(&outbox, "bad", "{}").await;
    let calls = Arc::new(AtomicUsize::new(0));
    let relay = OutboxRelay::new(
        outbox.clone(),
        quick(),
        failing_first(&calls, "400 bad address"),
    )
    .unwrap()
    .classify(|r: &Result<(), &str>| match r {
        Ok(()) => Action::Success,
        Err(e) if e.starts_with("400") => Action::Stop,
        Err(_) => Action::Retry { after: None },
    });
    assert_eq!(relay.pass().await.unwrap().parked, 1);
    assert_eq!(
        relay.pass().await.unwrap().claimed,
        0,
        "a parked row is not sent"
    );
    let parked = outbox.parked(10).await.unwrap();
    assert_eq!(parked.len(), 1);
    assert_eq!(parked[0].dedupe_key, "bad");
    assert_eq!(parked[0].attempts, 1);
    assert_eq!(parked[0].last_error.as_deref(), Some("400 bad address"));
    assert!(outbox.retry_parked(parked[0].id).await.unwrap());
    assert!(
        !outbox.retry_parked(parked[0].id).await.unwrap(),
        "no longer parked"
    );
    assert_eq!(relay.pass().await.unwrap().sent, 1);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert!(outbox.parked(10).await.unwrap().is_empty());
}

#[tokio::test]
async fn a_message_that_always_fails_is_parked_after_max_attempts() {
    let db = Schema::new().await;
    let outbox = db.outbox().await;
    db.enqueue(&outbox, "k", "{}").await;
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let relay = OutboxRelay::new(
        outbox.clone(),
        quick().max_attempts(3),
        service_fn(move |_m: OutboxMessage| {
            c.fetch_add(1, Ordering::SeqCst);
            async { Err::<(), _>("503") }
        }),
    )
    .unwrap();
    for _ in 0..10 {
        relay.pass().await.unwrap();
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    assert_eq!(outbox.parked(10).await.unwrap()[0].attempts, 3);
}

#[tokio::test]
async fn the_providers_retry_after_sets_the_next_attempt() {
    let db = Schema::new().await;
    let outbox = db.outbox().await;
    db.enqueue(&outbox, "k", "{}").await;
    let relay = OutboxRelay::new(
        outbox.clone(),
        quick(),
        service_fn(|_m: OutboxMessage| async { Err::<(), _>("429") }),
    )
    .unwrap()
    .classify(|r: &Result<(), &str>| match r {
        Ok(()) => Action::Success,
        Err(_) => Action::Retry {
            after: Some(Duration::from_secs(120)),
        },
    });
    relay.pass().await.unwrap();
    let wait = db
        .scalar("SELECT extract(epoch FROM next_attempt_at - now())::int8 FROM outbox")
        .await;
    assert!((110..=120).contains(&wait), "{wait}");
    assert_eq!(relay.pass().await.unwrap().claimed, 0);
}

#[tokio::test]
async fn a_dead_relays_rows_come_back_after_the_lease_counted_as_an_attempt() {
    let db = Schema::new().await;
    let outbox = db.outbox().await;
    db.enqueue(&outbox, "k", "{}").await;
    // A relay whose send never ends, killed mid-pass (its future dropped, tasks aborted).
    let hanging = OutboxRelay::new(
        outbox.clone(),
        quick(),
        service_fn(|_m: OutboxMessage| std::future::pending::<Result<(), &'static str>>()),
    )
    .unwrap();
    let _ = tokio::time::timeout(Duration::from_millis(200), hanging.pass()).await;

    let sent = Sent::default();
    let attempts = Arc::new(Mutex::new(Vec::new()));
    let (s, a) = (sent.clone(), attempts.clone());
    let live = OutboxRelay::new(
        outbox.clone(),
        quick(),
        service_fn(move |m: OutboxMessage| {
            s.note(&m);
            a.lock().unwrap().push(m.attempt());
            async { Ok::<_, &'static str>(()) }
        }),
    )
    .unwrap();
    assert_eq!(
        live.pass().await.unwrap().claimed,
        0,
        "leased to the dead relay"
    );
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(live.pass().await.unwrap().sent, 1);
    assert_eq!(*attempts.lock().unwrap(), [2]);
    assert_eq!(sent.total(), 1);
}

#[tokio::test]
async fn a_message_that_kills_every_relay_is_parked_unsent() {
    let db = Schema::new().await;
    let outbox = db.outbox().await;
    db.enqueue(&outbox, "poison", "{}").await;
    let hanging = OutboxRelay::new(
        outbox.clone(),
        quick().max_attempts(2),
        service_fn(|_m: OutboxMessage| std::future::pending::<Result<(), &'static str>>()),
    )
    .unwrap();
    for _ in 0..2 {
        let _ = tokio::time::timeout(Duration::from_millis(100), hanging.pass()).await;
        tokio::time::sleep(Duration::from_millis(1100)).await;
    }
    // Two relays died on it: the third claim parks it without calling the sender.
    let report = hanging.pass().await.unwrap();
    assert_eq!((report.claimed, report.parked), (1, 1));
    let parked = outbox.parked(1).await.unwrap();
    assert_eq!(parked[0].attempts, 2);
    assert!(parked[0]
        .last_error
        .as_deref()
        .unwrap_or("")
        .contains("lease expired"));
}

#[tokio::test]
async fn a_panicking_sender_is_a_failed_attempt() {
    let db = Schema::new().await;
    let outbox = db.outbox().await;
    db.enqueue(&outbox, "k", "{}").await;
    let relay = OutboxRelay::new(
        outbox.clone(),
        quick(),
        service_fn(|_m: OutboxMessage| async {
            if true {
                panic!("sender bug");
            }
            Ok::<_, &'static str>(())
        }),
    )
    .unwrap();
    assert_eq!(relay.pass().await.unwrap().failed, 1);
    assert_eq!(db.scalar("SELECT attempts::int8 FROM outbox").await, 1);
}

#[tokio::test]
async fn four_relays_draining_one_outbox_send_every_row_once() {
    let db = Schema::new().await;
    let outbox = db.outbox().await;
    let mut tx = db.pool.begin().await.unwrap();
    for i in 0..300 {
        outbox
            .enqueue(&mut tx, "email", &format!("k{i}"), "{}")
            .await
            .unwrap();
    }
    tx.commit().await.unwrap();
    let sent = Sent::default();
    let mut relays = Vec::new();
    for _ in 0..4 {
        let s = sent.clone();
        let relay = OutboxRelay::new(
            outbox.clone(),
            quick().batch_size(7),
            service_fn(move |m: OutboxMessage| {
                s.note(&m);
                async {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    Ok::<_, &'static str>(())
                }
            }),
        )
        .unwrap();
        relays.push(tokio::spawn(async move {
            let mut n = 0;
            for _ in 0..200 {
                let r = relay.pass().await.unwrap();
                n += r.sent;
                if r.claimed == 0 {
                    break;
                }
            }
            n
        }));
    }
    let mut total = 0;
    for r in relays {
        total += r.await.unwrap();
    }
    assert_eq!(total, 300);
    assert_eq!(sent.total(), 300);
    assert!((0..300).all(|i| sent.of(&format!("k{i}")) == 1));
}

#[tokio::test]
async fn run_wakes_on_notify_and_shutdown_releases_sends_in_flight() {
    let db = Schema::new().await;
    let outbox = db.outbox().await;
    let sent = Sent::default();
    let relay = OutboxRelay::new(
        outbox.clone(),
        quick()
            .poll_interval(Duration::from_secs(600))
            .shutdown_grace(Duration::from_millis(100)),
        sent.hanging_on("slow"),
    )
    .unwrap();
    let running = Running::start(|stopped| relay.run(stopped));
    // Give the relay time to LISTEN, then enqueue: only a NOTIFY can wake it (poll: 10 min).
    tokio::time::sleep(Duration::from_millis(300)).await;
    db.enqueue(&outbox, "fast", "{}").await;
    within(Duration::from_secs(5), || sent.of("fast") == 1).await;
    assert_eq!(sent.of("fast"), 1, "woken by NOTIFY");
    db.enqueue(&outbox, "slow", "{}").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let report = running.stop().await;
    assert_eq!(report.totals.sent, 1);
    assert_eq!(report.totals.released, 1);
    // Released, not leased: due now, with no attempt counted.
    assert_eq!(
        db.scalar("SELECT count(*) FROM outbox WHERE dedupe_key = 'slow' AND leased_until IS NULL AND attempts = 0 AND next_attempt_at <= now()").await,
        1
    );
}

#[tokio::test]
async fn another_table_in_another_schema_and_concurrent_migrations() {
    let db = Schema::new().await;
    sqlx::query(&format!("CREATE SCHEMA {}_app", db.name))
        .execute(&db.pool)
        .await
        .unwrap();
    let table = format!("{}_app.mail_out", db.name);
    let outbox = Outbox::new(db.pool.clone()).table(&table).unwrap();
    let migrations: Vec<_> = (0..4)
        .map(|_| {
            let o = outbox.clone();
            tokio::spawn(async move { o.migrate().await })
        })
        .collect();
    for m in migrations {
        m.await.unwrap().unwrap();
    }
    db.enqueue(&outbox, "k", "{}").await;
    let relay = OutboxRelay::new(
        outbox.clone(),
        quick(),
        service_fn(|_m: OutboxMessage| async { Ok::<_, &'static str>(()) }),
    )
    .unwrap();
    assert_eq!(relay.pass().await.unwrap().sent, 1);
    assert!(Outbox::new(db.pool.clone())
        .table("x; DROP TABLE y")
        .unwrap_err()
        .is_config());
    sqlx::query(&format!("DROP SCHEMA {}_app CASCADE", db.name))
        .execute(&db.pool)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_hanging_send_holds_back_only_its_own_row() {
    let db = Schema::new().await;
    let outbox = db.outbox().await;
    db.enqueue(&outbox, "hang", "{}").await;
    let sent = Sent::default();
    // The hanging send may take 24 s (80 % of a 30 s lease) before it is cut.
    let config = RelayConfig::new()
        .lease(Duration::from_secs(30))
        .poll_interval(Duration::from_secs(600))
        .shutdown_grace(Duration::from_millis(50));
    let relay = OutboxRelay::new(outbox.clone(), config, sent.hanging_on("hang")).unwrap();
    let running = Running::start(|stopped| relay.run(stopped));
    tokio::time::sleep(Duration::from_millis(300)).await;
    db.enqueue(&outbox, "fast", "{}").await;
    within(Duration::from_secs(5), || sent.of("fast") == 1).await;
    assert_eq!(sent.of("fast"), 1, "sent while the other send still hangs");
    let report = running.stop().await;
    assert_eq!((report.totals.sent, report.totals.released), (1, 1));
}

#[tokio::test]
async fn a_failed_row_is_tried_again_when_due_not_at_the_next_poll() {
    let db = Schema::new().await;
    let outbox = db.outbox().await;
    let calls = Arc::new(AtomicUsize::new(0));
    let relay = OutboxRelay::new(
        outbox.clone(),
        quick().poll_interval(Duration::from_secs(600)),
        failing_first(&calls, "503"),
    )
    .unwrap()
    .classify(|r: &Result<(), &str>| match r {
        Ok(()) => Action::Success,
        Err(_) => Action::Retry {
            after: Some(Duration::from_millis(300)),
        },
    });
    let running = Running::start(|stopped| relay.run(stopped));
    tokio::time::sleep(Duration::from_millis(300)).await;
    db.enqueue(&outbox, "k", "{}").await;
    within(Duration::from_secs(5), || calls.load(Ordering::SeqCst) == 2).await;
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "retried when due (poll: 10 min)"
    );
    let report = running.stop().await;
    assert_eq!((report.totals.failed, report.totals.sent), (1, 1));
}
