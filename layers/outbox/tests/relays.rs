//! Several relays and dead ones (crate docs "Semantics": "Several relays never send the same row
//! at once while leases hold", and the row "a relay dies mid-send"): four relays draining one
//! outbox send every row once, a slow statement before the sends never lets two relays send one
//! row at once, a dead relay's rows come back after the lease counted as an attempt (so a message
//! that kills every relay is parked), and a relay whose connections are killed, or that has a
//! one-connection pool, still sends and wakes on `NOTIFY`. Against the machine's PostgreSQL (`DATABASE_URL`,
//! default `postgres://postgres@127.0.0.1:5432/test`): every test works in its own schema, dropped
//! at the end, so runs never see each other.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::{quick, within, Running, Schema, Sent};
use tower::service_fn;
use tower_once_outbox::{Outbox, OutboxMessage, OutboxRelay};

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
