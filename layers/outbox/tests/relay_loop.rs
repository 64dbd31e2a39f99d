//! The relay's run loop (the `OutboxRelay` and `OutboxRelay::run` docs: up to `batch_size` sends in
//! flight, free slots refilled once a quarter of them is free; a slow or hanging provider holds
//! only its own slots; it claims when a row it failed is due again; it relays until `shutdown`
//! resolves, then lets sends in flight finish within `shutdown_grace` and releases the rest), and
//! no spin whatever wakes it; it wakes on `NOTIFY` for a new row or a parked row a person
//! retried, and an unbounded `shutdown_grace` is not a panic. Against the machine's PostgreSQL (`DATABASE_URL`, default
//! `postgres://postgres@127.0.0.1:5432/test`); each test works in its own schema, dropped at the
//! end.

mod support;

use sqlx::postgres::PgPoolOptions;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::{failing_first, within, Running, Schema, Sent};
use tower::service_fn;
use tower_once_outbox::{Outbox, OutboxMessage, OutboxRelay, RelayConfig};
use tower_once_retry::backoff::Backoff;
use tower_once_retry::classify::Action;

/// A 10 s lease: the loop's own timers, not lease expiry, are under test here.
fn quick() -> RelayConfig {
    RelayConfig::new()
        .lease(Duration::from_secs(10))
        .send_timeout(Duration::from_secs(8))
        .backoff(Backoff::new(Duration::from_millis(1), 1.0, Duration::from_millis(1)).unwrap())
        .shutdown_grace(Duration::from_millis(100))
}

/// CPU time (user + system) of the calling thread. The tests below run the relay on a
/// current-thread runtime, so this is the loop's own CPU time.
fn thread_cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    // Fields 14 and 15 of stat(5); `after` starts at field 3.
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    Duration::from_millis(ticks * 10)
}

/// Commits `n` rows, one transaction (so one NOTIFY) each, from a thread of its own so that
/// the relay's thread does none of that work.
fn enqueue_elsewhere(outbox: Outbox, prefix: &'static str, n: usize, pause: Duration) {
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            for i in 0..n {
                let mut tx = outbox.pool().begin().await.unwrap();
                outbox
                    .enqueue(&mut tx, "email", &format!("{prefix}-{i}"), "{}")
                    .await
                    .unwrap();
                tx.commit().await.unwrap();
                tokio::time::sleep(pause).await;
            }
        });
    })
    .join()
    .unwrap();
}

/// The relay "claims ... when a row it failed is due again" for every such row, not only the
/// soonest: row `b` (due after 800 ms) is sent then, not at the next poll (30 s here, 5 s by
/// default). Was broken: `soonest_retry` held one instant, and the sleep branch set it to `None`
/// when it fired, so every later due time of the relay's other failed rows was forgotten.
#[tokio::test]
async fn every_failed_row_is_retried_when_due_not_only_the_soonest() {
    let db = Schema::new().await;
    let outbox = db.outbox().await;
    db.enqueue(&outbox, "a", "{}").await;
    db.enqueue(&outbox, "b", "{}").await;
    let sent = Sent::default();
    let s = sent.clone();
    let relay = OutboxRelay::new(
        outbox.clone(),
        quick().poll_interval(Duration::from_secs(30)),
        service_fn(move |m: OutboxMessage| {
            let first = m.attempt() == 1;
            let key = m.dedupe_key().to_owned();
            if !first {
                s.note(&m);
            }
            async move {
                match (first, key.as_str()) {
                    (true, "a") => Err("a"),
                    (true, _) => Err("b"),
                    _ => Ok(()),
                }
            }
        }),
    )
    .unwrap()
    .classify(|r: &Result<(), &str>| match r {
        Ok(()) => Action::Success,
        Err("a") => Action::Retry {
            after: Some(Duration::from_millis(200)),
        },
        Err(_) => Action::Retry {
            after: Some(Duration::from_millis(800)),
        },
    });
    let report = relay.run(tokio::time::sleep(Duration::from_secs(3))).await;
    assert_eq!(sent.of("a"), 1, "{report:?}");
    assert_eq!(
        sent.of("b"),
        1,
        "row b was due again 800 ms in, but the relay forgot it after retrying row a: {report:?}"
    );
}

/// "A slow or hanging provider holds only its own slots": with `batch_size` 8, seven hanging sends
/// leave one slot free, and due rows go out through it. Was broken: the relay claimed only once 2
/// slots were free, and nothing (a finished send, a NOTIFY, the 200 ms poll) ever claimed into the
/// last one: due rows waited for the hanging sends' `send_timeout`.
#[tokio::test]
async fn hanging_sends_hold_only_their_own_slots() {
    let db = Schema::new().await;
    let outbox = db.outbox().await;
    for i in 0..7 {
        db.enqueue(&outbox, &format!("hang-{i}"), "{}").await;
    }
    for i in 0..5 {
        db.enqueue(&outbox, &format!("fast-{i}"), "{}").await;
    }
    let sent = Sent::default();
    let relay = OutboxRelay::new(
        outbox.clone(),
        quick()
            .batch_size(8)
            .poll_interval(Duration::from_millis(200))
            .shutdown_grace(Duration::ZERO),
        sent.hanging_on("hang"),
    )
    .unwrap();
    let report = relay.run(tokio::time::sleep(Duration::from_secs(3))).await;
    assert_eq!(report.totals.released, 7, "{report:?}");
    assert_eq!(
        sent.keys_starting("fast"),
        5,
        "one slot stayed free for 3 s (15 polls) while fast rows were due: {report:?}"
    );
}

/// `run` "lets sends in flight finish within `shutdown_grace` and releases the rest": a send that
/// returned `Ok` while the relay was stopping (here it finishes 200 ms after the grace, while the
/// relay is still joining it) is recorded sent, never released and sent again by the next relay.
/// The sender blocks its thread to hold the race open deterministically (a synchronous SDK call
/// does the same). Was broken: `release_all` aborted the sends still running and then joined them,
/// throwing away what the join returned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_that_returned_ok_during_shutdown_is_recorded_sent() {
    let db = Schema::new().await;
    let outbox = db.outbox().await;
    db.enqueue(&outbox, "k", "{}").await;
    let sent = Sent::default();
    let s = sent.clone();
    let stop = Arc::new(tokio::sync::Notify::new());
    let st = stop.clone();
    let relay = OutboxRelay::new(
        outbox.clone(),
        quick().shutdown_grace(Duration::from_millis(100)),
        service_fn(move |m: OutboxMessage| {
            let (s, st) = (s.clone(), st.clone());
            async move {
                st.notify_one();
                std::thread::sleep(Duration::from_millis(300));
                s.note(&m);
                Ok::<_, &'static str>(())
            }
        }),
    )
    .unwrap();
    let report = relay.run(async move { stop.notified().await }).await;
    assert_eq!(sent.of("k"), 1);
    let unsent = db
        .scalar("SELECT count(*) FROM outbox WHERE sent_at IS NULL")
        .await;
    assert_eq!(
        (unsent, report.totals.sent),
        (0, 1),
        "the sender returned Ok before run() returned, and the relay had that outcome in \
         hand, yet it released the row (to be sent again): {report:?}"
    );
}

/// The relay "relays until `shutdown` resolves, then lets sends in flight finish within
/// `shutdown_grace`", also while Postgres refuses connections: with no sends in flight and no
/// grace, the shutdown is prompt. Was broken: the loop sat in `listen()` and in the claim (each as
/// long as the pool's `acquire_timeout`, 30 s by default), outside the `select!`, and `retry_at`,
/// counted from the claim's start, left a wake-up already due that raced the shutdown branch in
/// `select!` and won half the time, starting another listen + claim. With a 1.5 s acquire timeout
/// this was seen taking 4 rounds (12 s; a minute per round at the default 30 s); here (600 ms) the
/// growing backoff bounds it.
#[tokio::test]
async fn shutdown_is_prompt_while_postgres_is_unreachable() {
    let pool = PgPoolOptions::new()
        .acquire_timeout(Duration::from_millis(600))
        .connect_lazy("postgres://postgres@127.0.0.1:1/test")
        .unwrap();
    let relay = OutboxRelay::new(
        Outbox::new(pool),
        quick().shutdown_grace(Duration::ZERO),
        service_fn(|_m: OutboxMessage| async { Ok::<_, &'static str>(()) }),
    )
    .unwrap();
    let started = Instant::now();
    let report = relay
        .run(tokio::time::sleep(Duration::from_millis(100)))
        .await;
    let took = started.elapsed();
    assert!(
        took < Duration::from_millis(500),
        "shutdown asked for at 100 ms, run() returned after {took:?}: {report:?}"
    );
}

/// All slots hanging, a NOTIFY every 5 ms: each wakes the loop once, no claim is made and the
/// loop's thread stays nearly idle.
#[tokio::test]
async fn no_spin_with_every_slot_hanging_and_notifies_arriving() {
    let db = Schema::new().await;
    let outbox = db.outbox().await;
    for i in 0..4 {
        db.enqueue(&outbox, &format!("hang-{i}"), "{}").await;
    }
    let relay = OutboxRelay::new(
        outbox.clone(),
        quick()
            .batch_size(4)
            .poll_interval(Duration::from_millis(50))
            .shutdown_grace(Duration::ZERO),
        service_fn(|_m: OutboxMessage| async {
            std::future::pending::<()>().await;
            Ok::<_, &'static str>(())
        }),
    )
    .unwrap();
    let o = outbox.clone();
    let cpu = thread_cpu();
    let wall = Instant::now();
    let inserts = tokio::task::spawn_blocking(move || {
        enqueue_elsewhere(o, "n", 200, Duration::from_millis(5));
    });
    let report = relay
        .run(async {
            inserts.await.unwrap();
        })
        .await;
    let (cpu, wall) = (thread_cpu() - cpu, wall.elapsed());
    assert_eq!(report.passes, 1, "{report:?}");
    assert_eq!(report.totals.released, 4, "{report:?}");
    assert!(cpu < wall / 4, "loop thread used {cpu:?} of {wall:?}");
}

/// Postgres refusing connections (a pool at a closed port, short acquire timeout): claims
/// back off, the thread stays idle.
#[tokio::test]
async fn no_spin_while_postgres_is_unreachable() {
    let pool = PgPoolOptions::new()
        .acquire_timeout(Duration::from_millis(50))
        .connect_lazy("postgres://postgres@127.0.0.1:1/test")
        .unwrap();
    let relay = OutboxRelay::new(
        Outbox::new(pool),
        quick()
            .poll_interval(Duration::from_millis(10))
            .shutdown_grace(Duration::ZERO),
        service_fn(|_m: OutboxMessage| async { Ok::<_, &'static str>(()) }),
    )
    .unwrap();
    let cpu = thread_cpu();
    let report = relay.run(tokio::time::sleep(Duration::from_secs(3))).await;
    let cpu = thread_cpu() - cpu;
    assert!(report.failed_passes <= 12, "{report:?}");
    assert!(cpu < Duration::from_millis(600), "{cpu:?}: {report:?}");
}

/// A 10 ms poll with nothing due: about one claim per poll, no more.
#[tokio::test]
async fn a_10ms_poll_claims_about_once_per_poll() {
    let db = Schema::new().await;
    let outbox = db.outbox().await;
    let relay = OutboxRelay::new(
        outbox.clone(),
        quick().poll_interval(Duration::from_millis(10)),
        service_fn(|_m: OutboxMessage| async { Ok::<_, &'static str>(()) }),
    )
    .unwrap();
    let report = relay.run(tokio::time::sleep(Duration::from_secs(1))).await;
    assert!(
        (20..=110).contains(&report.passes),
        "{} claims in 1 s",
        report.passes
    );
}

/// 1000 commits, one NOTIFY each, while the relay runs: each row sent exactly once, recorded.
#[tokio::test]
async fn a_burst_of_1000_notifies_sends_each_row_once() {
    let db = Schema::new().await;
    let outbox = db.outbox().await;
    let sent = Sent::default();
    let s = sent.clone();
    let relay = OutboxRelay::new(
        outbox.clone(),
        quick().poll_interval(Duration::from_secs(30)),
        service_fn(move |m: OutboxMessage| {
            s.note(&m);
            async {
                tokio::time::sleep(Duration::from_millis(fastrand::u64(0..5))).await;
                Ok::<_, &'static str>(())
            }
        }),
    )
    .unwrap();
    let o = outbox.clone();
    let pool = db.pool.clone();
    let report = relay
        .run(async move {
            let mut writers = Vec::new();
            for w in 0..4 {
                let o = o.clone();
                writers.push(tokio::spawn(async move {
                    for i in 0..250 {
                        let mut tx = o.pool().begin().await.unwrap();
                        o.enqueue(&mut tx, "email", &format!("w{w}-{i}"), "{}")
                            .await
                            .unwrap();
                        tx.commit().await.unwrap();
                    }
                }));
            }
            for w in writers {
                w.await.unwrap();
            }
            for _ in 0..80 {
                let unsent: i64 =
                    sqlx::query_scalar("SELECT count(*) FROM outbox WHERE sent_at IS NULL")
                        .fetch_one(&pool)
                        .await
                        .unwrap();
                if unsent == 0 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await;
    assert_eq!(sent.total(), 1000, "{report:?}");
    assert_eq!(sent.max(), 1, "{report:?}");
    assert_eq!(
        db.scalar("SELECT count(*) FROM outbox WHERE sent_at IS NULL")
            .await,
        0
    );
    assert_eq!(report.totals.sent, 1000, "{report:?}");
}

/// Rows parked unsent at claim fill a whole claim while the slots stay free: the loop claims
/// again at once (backlog), and the good rows behind them go out without waiting for a poll.
#[tokio::test]
async fn rows_parked_at_claim_do_not_stall_the_rows_behind_them() {
    let db = Schema::new().await;
    let outbox = db.outbox().await;
    for i in 0..6 {
        db.enqueue(&outbox, &format!("dead-{i}"), "{}").await;
    }
    for i in 0..3 {
        db.enqueue(&outbox, &format!("good-{i}"), "{}").await;
    }
    // Earlier relays died on the dead rows max_attempts - 1 times and once more now.
    sqlx::query(
        "UPDATE outbox SET attempts = 2, leased_until = now() - interval '1 s', \
         lease_token = 1, next_attempt_at = now() - interval '1 s' WHERE dedupe_key LIKE 'dead-%'",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let sent = Sent::default();
    let s = sent.clone();
    let relay = OutboxRelay::new(
        outbox.clone(),
        quick()
            .batch_size(2)
            .max_attempts(3)
            .poll_interval(Duration::from_secs(30)),
        service_fn(move |m: OutboxMessage| {
            s.note(&m);
            async { Ok::<_, &'static str>(()) }
        }),
    )
    .unwrap();
    let report = relay
        .run(tokio::time::sleep(Duration::from_millis(800)))
        .await;
    assert_eq!(report.totals.parked, 6, "{report:?}");
    assert_eq!(sent.keys_starting("good"), 3, "{report:?}");
    assert_eq!(sent.keys_starting("dead"), 0, "{report:?}");
}

/// `batch_size` 1 with a backlog: one send at a time, each row once, no claim beyond need.
#[tokio::test]
async fn batch_size_1_drains_a_backlog() {
    let db = Schema::new().await;
    let outbox = db.outbox().await;
    for i in 0..20 {
        db.enqueue(&outbox, &format!("k{i}"), "{}").await;
    }
    let sent = Sent::default();
    let s = sent.clone();
    let relay = OutboxRelay::new(
        outbox.clone(),
        quick().batch_size(1).poll_interval(Duration::from_secs(30)),
        service_fn(move |m: OutboxMessage| {
            s.note(&m);
            async { Ok::<_, &'static str>(()) }
        }),
    )
    .unwrap();
    let report = relay
        .run(tokio::time::sleep(Duration::from_millis(1500)))
        .await;
    assert_eq!((sent.total(), sent.max()), (20, 1), "{report:?}");
    // One claim per row, plus the one that found nothing.
    assert!(report.passes <= 22, "{report:?}");
}

/// A failed row taken by another relay before this one's `soonest_retry` fires: the wake-up
/// claims nothing, once, and the loop goes quiet (no spin, no double send).
#[tokio::test]
async fn a_retry_taken_by_another_relay_costs_one_empty_claim() {
    let db = Schema::new().await;
    let outbox = db.outbox().await;
    db.enqueue(&outbox, "k", "{}").await;
    let sent = Sent::default();
    let s = sent.clone();
    let failing = OutboxRelay::new(
        outbox.clone(),
        quick().poll_interval(Duration::from_secs(30)),
        service_fn(move |m: OutboxMessage| {
            let first = m.attempt() == 1;
            s.note(&m);
            async move {
                if first {
                    Err("later")
                } else {
                    Ok(())
                }
            }
        }),
    )
    .unwrap()
    .classify(|r: &Result<(), &str>| match r {
        Ok(()) => Action::Success,
        Err(_) => Action::Retry {
            after: Some(Duration::from_millis(300)),
        },
    });
    let o = outbox.clone();
    let other_sent = Sent::default();
    let os = other_sent.clone();
    let report = failing
        .run(async move {
            tokio::time::sleep(Duration::from_millis(150)).await;
            // Another relay's clock says the row is due (made so here), and it takes the row
            // before this relay's wake-up at 300 ms.
            sqlx::query("UPDATE outbox SET next_attempt_at = now()")
                .execute(o.pool())
                .await
                .unwrap();
            let thief = OutboxRelay::new(
                o,
                quick(),
                service_fn(move |m: OutboxMessage| {
                    os.note(&m);
                    async { Ok::<_, &'static str>(()) }
                }),
            )
            .unwrap();
            assert_eq!(thief.pass().await.unwrap().sent, 1);
            tokio::time::sleep(Duration::from_millis(700)).await;
        })
        .await;
    assert_eq!(sent.total() + other_sent.total(), 2, "{report:?}");
    assert!(report.passes <= 3, "{report:?}");
}

#[tokio::test]
async fn run_wakes_on_notify_and_shutdown_releases_sends_in_flight() {
    let db = Schema::new().await;
    let outbox = db.outbox().await;
    let sent = Sent::default();
    let relay = OutboxRelay::new(
        outbox.clone(),
        support::quick()
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
        support::quick().poll_interval(Duration::from_secs(600)),
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
        support::quick().poll_interval(Duration::from_secs(600)),
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

/// `shutdown_grace(Duration::MAX)` ("let sends in flight finish, however long") is accepted by
/// `validate`, and `run` then stops without a panic while a send is in flight. Was broken:
/// `Instant::now() + grace` overflowed (pass.rs) as soon as a send was in flight.
#[tokio::test]
async fn an_unbounded_shutdown_grace_does_not_panic_at_shutdown() {
    let db = Schema::new().await;
    let outbox = db.outbox().await;
    let config = support::quick()
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
