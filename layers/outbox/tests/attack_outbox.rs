//! Attacks on the outbox and its relay, against the machine's PostgreSQL (`DATABASE_URL`,
//! default `postgres://postgres@127.0.0.1:5432/test`). Each test works in its own schema,
//! dropped at the end. The tests that fail name a broken promise; the others held up.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::{failing_first, quick, within, Running, Schema, Sent};
use tower::service_fn;
use tower_once_outbox::{Enqueued, Outbox, OutboxMessage, OutboxRelay};
use tower_once_retry::classify::Action;

// ---------------------------------------------------------------------------------------------
// Breaks
// ---------------------------------------------------------------------------------------------

/// Was a break, now fixed: `Stop` parks at once — unless the provider's error text holds a NUL byte. Postgres
/// `TEXT` refuses `\0`, so the fenced `failed` UPDATE errors, the error is only logged, and
/// the row stays leased: no park, no `last_error`, no backoff. After the lease the claim counts
/// a "lease expired" attempt and the 400 is sent again, `max_attempts` times in all.
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

/// Was a break, now fixed: `shutdown_grace(Duration::MAX)` ("let sends in flight finish, however long") is
/// accepted by `validate`, and then `run` panics at shutdown: `Instant::now() + grace`
/// overflows (pass.rs) as soon as a send is in flight.
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

/// Was a break, now fixed: a relay whose pool has one connection never sends: `run` LISTENs through
/// `PgListener::connect_with(pool)`, which keeps that pool connection for good, so every
/// pass waits for `acquire_timeout` and fails. Nothing documents a minimum pool size.
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

/// Was a break, now fixed: `retry_parked` promises "a relay picks it up at once", but it is an UPDATE and only
/// INSERT fires the NOTIFY trigger: a running relay sends it at its next poll (5 s by default,
/// here 10 min).
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

/// Was a break, now fixed: `Outbox::table` "fails, with `is_config`, on any other name: it is written into
/// SQL", but a reserved word passes the check (lowercase letters) and then every statement is
/// a syntax error: `CREATE TABLE IF NOT EXISTS user (...`.
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

/// Was a break, now fixed: two relays send the same row at once. The send's deadline (80 % of the lease)
/// starts when its task starts, not when the lease was written: a pass first parks the rows
/// that killed earlier relays, one statement at a time, and only then spawns the sends. When
/// such a statement is slow (here a trigger stands in for a lock wait or a slow disk), the
/// lease has run out before the send begins; a second relay claims the row and both send.
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

// ---------------------------------------------------------------------------------------------
// What held up (cheap)
// ---------------------------------------------------------------------------------------------

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
