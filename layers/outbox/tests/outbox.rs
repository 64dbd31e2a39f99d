//! The outbox and its relay (crate docs; examples/pipeline/README.md): a message commits with its
//! transaction and is sent once, a dedupe key is written once, failures are retried, parked after
//! `max_attempts` or at once when permanent, and sent again when a person retries them; a dead
//! relay's rows come back after the lease; several relays never send one row twice; the table name
//! is checked; hostile keys and payloads are stored verbatim. Against the machine's PostgreSQL
//! (`DATABASE_URL`, default `postgres://postgres@127.0.0.1:5432/test`): every test works in its own
//! schema, dropped at the end, so runs never see each other.

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

/// `Stop` parks the row at once, also when the provider's error text holds a NUL byte (Postgres
/// `TEXT` refuses `\0`). Was broken: the fenced `failed` UPDATE errored, the error was only logged,
/// and the row stayed leased: no park, no `last_error`, no backoff; after the lease the claim
/// counted a "lease expired" attempt and the 400 was sent again, `max_attempts` times in all.
#[tokio::test]
async fn a_stop_whose_error_text_holds_a_nul_byte_still_parks_the_row() {
    let db = Schema::new().await;
    let outbox = db.outbox().await;
    db.enqueue(&outbox, "nul", "{}").await;
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let relay = OutboxRelay::new(
        outbox.clone(),
        quick(),
        service_fn(move |_m: OutboxMessage| {
            c.fetch_add(1, Ordering::SeqCst);
            // A provider body echoed into the error: bytes it chose.
            async { Err::<(), _>("400 bad address: a\0b".to_owned()) }
        }),
    )
    .unwrap()
    .classify(|r: &Result<(), String>| match r {
        Ok(()) => Action::Success,
        Err(e) if e.starts_with("400") => Action::Stop,
        Err(_) => Action::Retry { after: None },
    });
    let report = relay.pass().await.unwrap();
    assert_eq!(
        report.parked, 1,
        "a Stop must park the row at once: {report:?}"
    );
    let parked = outbox.parked(10).await.unwrap();
    assert_eq!(parked.len(), 1, "the 400 is parked for a person");
    // And it is not sent again after the lease.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    relay.pass().await.unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 1, "a 400 is sent once");
}

/// `shutdown_grace(Duration::MAX)` ("let sends in flight finish, however long") is accepted by
/// `validate`, and `run` then stops without a panic while a send is in flight. Was broken:
/// `Instant::now() + grace` overflowed (pass.rs) as soon as a send was in flight.
#[tokio::test]
async fn an_unbounded_shutdown_grace_does_not_panic_at_shutdown() {
    let db = Schema::new().await;
    let outbox = db.outbox().await;
    let config = quick()
        .poll_interval(Duration::from_millis(50))
        .shutdown_grace(Duration::MAX);
    assert!(config.validate().is_ok());
    let started = Arc::new(AtomicUsize::new(0));
    let s = started.clone();
    let relay = OutboxRelay::new(
        outbox.clone(),
        config,
        service_fn(move |_m: OutboxMessage| {
            s.fetch_add(1, Ordering::SeqCst);
            async {
                tokio::time::sleep(Duration::from_millis(300)).await;
                Ok::<_, &'static str>(())
            }
        }),
    )
    .unwrap();
    let running = Running::start(|stopped| relay.run(stopped));
    db.enqueue(&outbox, "in-flight", "{}").await;
    assert!(
        within(Duration::from_secs(5), || started.load(Ordering::SeqCst)
            == 1)
        .await
    );
    let report = running.stop().await;
    assert_eq!(report.totals.sent, 1, "the send in flight finished");
}

/// A relay whose pool has one connection still sends (nothing documents a minimum pool size). Was
/// broken: `run` LISTENed through `PgListener::connect_with(pool)`, which kept that pool connection
/// for good, so every pass waited for `acquire_timeout` and failed.
#[tokio::test]
async fn a_relay_on_a_one_connection_pool_still_sends() {
    let db = Schema::new().await;
    db.outbox().await;
    let small = Schema::pool_for(&db.name, 1, Duration::from_millis(500)).await;
    let outbox = Outbox::new(small);
    let sent = Sent::default();
    let s = sent.clone();
    let relay = OutboxRelay::new(
        outbox,
        quick().poll_interval(Duration::from_millis(100)),
        service_fn(move |m: OutboxMessage| {
            s.note(&m);
            async { Ok::<_, &'static str>(()) }
        }),
    )
    .unwrap();
    let running = Running::start(|stopped| relay.run(stopped));
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Enqueued through the test's own pool.
    db.enqueue(&Outbox::new(db.pool.clone()), "k", "{}").await;
    let delivered = within(Duration::from_secs(4), || sent.of("k") == 1).await;
    let report = running.stop().await;
    assert!(
        delivered,
        "never sent with a one-connection pool: {report:?}"
    );
}

/// `retry_parked` promises "a relay picks it up at once": a running relay sends the retried row
/// without waiting for its next poll (5 s by default, here 10 min). Was broken: it is an UPDATE,
/// and only INSERT fired the NOTIFY trigger.
#[tokio::test]
async fn a_running_relay_picks_up_a_retried_parked_row_at_once() {
    let db = Schema::new().await;
    let outbox = db.outbox().await;
    let calls = Arc::new(AtomicUsize::new(0));
    let relay = OutboxRelay::new(
        outbox.clone(),
        quick().poll_interval(Duration::from_secs(600)),
        failing_first(&calls, "400 bad address"),
    )
    .unwrap()
    .classify(|r: &Result<(), &str>| match r {
        Ok(()) => Action::Success,
        Err(_) => Action::Stop,
    });
    let running = Running::start(|stopped| relay.run(stopped));
    tokio::time::sleep(Duration::from_millis(300)).await;
    db.enqueue(&outbox, "k", "{}").await;
    assert!(
        within(Duration::from_secs(5), || calls.load(Ordering::SeqCst) == 1).await,
        "woken by NOTIFY"
    );
    let mut parked = Vec::new();
    for _ in 0..50 {
        parked = outbox.parked(10).await.unwrap();
        if !parked.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(parked.len(), 1);
    assert!(outbox.retry_parked(parked[0].id).await.unwrap());
    let resent = within(Duration::from_secs(3), || calls.load(Ordering::SeqCst) == 2).await;
    running.stop_ignoring_outcome().await;
    assert!(resent, "retry_parked: a running relay picks it up at once");
}

/// `Outbox::table` "fails, with `is_config`, on any other name: it is written into SQL": a reserved
/// word is refused or works, never a name that every statement then fails on. Was broken: a
/// reserved word passed the check (lowercase letters), and every statement was a syntax error:
/// `CREATE TABLE IF NOT EXISTS user (...`.
#[tokio::test]
async fn a_reserved_word_table_name_is_refused_or_works() {
    let db = Schema::new().await;
    for name in ["user", "order", "select"] {
        match Outbox::new(db.pool.clone()).table(name) {
            Err(e) => assert!(e.is_config(), "{name}: {e}"),
            Ok(outbox) => {
                let migrated = outbox.migrate().await;
                assert!(
                    migrated.is_ok(),
                    "table({name:?}) was accepted, then migrate failed: {:?}",
                    migrated
                        .err()
                        .and_then(|e| std::error::Error::source(&e).map(ToString::to_string))
                );
            }
        }
    }
}

/// Two relays never send the same row at once, even when a statement the pass makes before it
/// spawns the sends is slow (here a trigger stands in for a lock wait or a slow disk). Was broken:
/// the send's deadline (80 % of the lease) started when its task started, not when the lease was
/// written, and a pass first parks the rows that killed earlier relays, one statement at a time:
/// the lease had run out before the send began, a second relay claimed the row and both sent.
#[tokio::test]
async fn a_slow_statement_before_the_sends_does_not_let_two_relays_send_one_row_at_once() {
    let db = Schema::new().await;
    let outbox = db.outbox().await;
    // Parking is slow: 1.5 s, longer than the 1 s lease.
    sqlx::raw_sql(
        "CREATE FUNCTION slow_park() RETURNS trigger LANGUAGE plpgsql AS $$ \
         BEGIN PERFORM pg_sleep(1.5); RETURN NEW; END $$; \
         CREATE TRIGGER slow_park BEFORE UPDATE ON outbox FOR EACH ROW \
         WHEN (NEW.parked_at IS NOT NULL AND OLD.parked_at IS NULL) \
         EXECUTE FUNCTION slow_park();",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    // A row a relay died on before, and then another one left leased (its attempt is counted
    // at the next claim, which parks it: max_attempts 2), then an ordinary row.
    sqlx::query(
        "INSERT INTO outbox (topic, dedupe_key, payload, attempts, next_attempt_at, leased_until, \
         lease_token) VALUES ('email', 'poison', '\\x7b7d', 1, now() - interval '10 s', \
         now() - interval '10 s', 1)",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    db.enqueue(&outbox, "good", "{}").await;

    let in_flight = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let sends = Arc::new(AtomicUsize::new(0));
    let sender = {
        let (in_flight, most, sends) = (in_flight.clone(), most.clone(), sends.clone());
        service_fn(move |m: OutboxMessage| {
            let (in_flight, most, sends) = (in_flight.clone(), most.clone(), sends.clone());
            async move {
                if m.dedupe_key() == "good" {
                    sends.fetch_add(1, Ordering::SeqCst);
                    let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(600)).await;
                    in_flight.fetch_sub(1, Ordering::SeqCst);
                }
                Ok::<_, &'static str>(())
            }
        })
    };
    let config = quick().max_attempts(2);
    let a = OutboxRelay::new(outbox.clone(), config.clone(), sender.clone()).unwrap();
    let b = OutboxRelay::new(outbox.clone(), config, sender).unwrap();
    let first = tokio::spawn(async move { a.pass().await.unwrap() });
    // Relay B passes after A's lease ran out, as its poll would.
    tokio::time::sleep(Duration::from_millis(1150)).await;
    let second = b.pass().await.unwrap();
    let first = tokio::time::timeout(Duration::from_secs(10), first)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        most.load(Ordering::SeqCst),
        1,
        "two relays sent 'good' at the same time (A: {first:?}, B: {second:?}, sends: {})",
        sends.load(Ordering::SeqCst)
    );
    assert_eq!(sends.load(Ordering::SeqCst), 1, "'good' was sent twice");
}

#[tokio::test]
async fn concurrent_enqueues_of_one_key_wait_and_follow_the_first_transaction() {
    let db = Schema::new().await;
    let outbox = db.outbox().await;
    for commit_first in [false, true] {
        let key = format!("race-{commit_first}");
        let mut t1 = db.pool.begin().await.unwrap();
        let first = outbox.enqueue(&mut t1, "email", &key, "{}").await.unwrap();
        assert!(!first.is_duplicate());
        let (o, p, k) = (outbox.clone(), db.pool.clone(), key.clone());
        let second = tokio::spawn(async move {
            let mut t2 = p.begin().await.unwrap();
            let same = o.enqueue(&mut t2, "email", &k, "{}").await;
            // Another payload under the same key, in the same (still usable) transaction.
            let other = o.enqueue(&mut t2, "email", &k, "{\"x\":1}").await;
            o.enqueue(&mut t2, "email", &format!("{k}-after"), "{}")
                .await
                .unwrap();
            t2.commit().await.unwrap();
            (same.unwrap(), other)
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!second.is_finished(), "waits for the first transaction");
        if commit_first {
            t1.commit().await.unwrap();
        } else {
            t1.rollback().await.unwrap();
        }
        let (same, other) = second.await.unwrap();
        if commit_first {
            assert_eq!(same, Enqueued::Duplicate(first.id()));
        } else {
            assert!(matches!(same, Enqueued::New(_)));
        }
        assert!(other.unwrap_err().is_key_reused());
    }
    assert_eq!(db.scalar("SELECT count(*) FROM outbox").await, 4);
}

#[tokio::test]
async fn hostile_keys_topics_payloads_and_delays_are_stored_verbatim_without_panics() {
    let db = Schema::new().await;
    let outbox = db.outbox().await.max_payload(64 * 1024);
    let mut tx = db.pool.begin().await.unwrap();
    let key = "';DROP/**/TABLE/**/outbox;--\\$1%s{}";
    let topic = "'); DELETE FROM outbox; -- ünï 🦀";
    let exact = vec![0u8; 64 * 1024];
    outbox.enqueue(&mut tx, topic, key, exact).await.unwrap();
    let long = "k".repeat(tower_once_outbox::MAX_KEY_LEN);
    outbox
        .enqueue(&mut tx, "t", &long, "\0\u{1}")
        .await
        .unwrap();
    assert!(outbox
        .enqueue(&mut tx, "t", "over", vec![0u8; 64 * 1024 + 1])
        .await
        .unwrap_err()
        .is_invalid());
    assert!(outbox
        .enqueue(&mut tx, "t\u{7f}", "del", "{}")
        .await
        .unwrap_err()
        .is_invalid());
    tx.commit().await.unwrap();

    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let relay = OutboxRelay::new(
        outbox.clone(),
        quick(),
        service_fn(move |m: OutboxMessage| {
            s.lock().unwrap().push((
                m.topic().to_owned(),
                m.dedupe_key().to_owned(),
                m.payload().len(),
            ));
            async { Err::<(), _>("é".repeat(5000)) }
        }),
    )
    .unwrap()
    .classify(|_: &Result<(), String>| Action::Retry {
        after: Some(Duration::MAX),
    });
    assert_eq!(relay.pass().await.unwrap().failed, 2);
    let mut seen = seen.lock().unwrap().clone();
    seen.sort();
    assert!(seen.contains(&(topic.to_owned(), key.to_owned(), 64 * 1024)));
    assert!(seen.contains(&("t".to_owned(), long.clone(), 2)));
    // Retry-After: Duration::MAX is capped at a day; the error text at 2 KiB.
    assert_eq!(
        db.scalar(
            "SELECT count(*) FROM outbox WHERE next_attempt_at BETWEEN now() + interval '23 h' \
             AND now() + interval '25 h' AND octet_length(last_error) <= 2048"
        )
        .await,
        2
    );
    assert_eq!(db.scalar("SELECT count(*) FROM outbox").await, 2);
}

#[tokio::test]
async fn a_relay_whose_connections_are_killed_recovers_and_still_wakes_on_notify() {
    let db = Schema::new().await;
    let outbox = db.outbox().await;
    let sent = Sent::default();
    let s = sent.clone();
    let relay = OutboxRelay::new(
        outbox.clone(),
        quick().poll_interval(Duration::from_secs(600)),
        service_fn(move |m: OutboxMessage| {
            s.note(&m);
            async { Ok::<_, &'static str>(()) }
        }),
    )
    .unwrap();
    let running = Running::start(|stopped| relay.run(stopped));
    tokio::time::sleep(Duration::from_millis(300)).await;
    db.enqueue(&outbox, "before", "{}").await;
    assert!(within(Duration::from_secs(3), || sent.of("before") == 1).await);
    assert!(db.kill_connections().await >= 1);
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Only a NOTIFY can wake it now (poll: 10 min); the test pool reconnects by itself.
    let mut enqueued = false;
    for _ in 0..20 {
        let Ok(mut tx) = db.pool.begin().await else {
            continue;
        };
        if outbox
            .enqueue(&mut tx, "email", "after", "{}")
            .await
            .is_ok()
            && tx.commit().await.is_ok()
        {
            enqueued = true;
            break;
        }
    }
    assert!(enqueued);
    let delivered = within(Duration::from_secs(2), || sent.of("after") == 1).await;
    running.stop_ignoring_outcome().await;
    assert!(
        delivered,
        "the relay re-LISTENed after its connections died"
    );
}
