//! Failed sends (crate docs "Semantics", the rows "classified `Retry { after }`, an error, a
//! timeout or a panic" and "classified `Stop`, or `attempts` reaches `max_attempts`"): a provider
//! that is down is retried and the message sent on a later pass, the provider's `Retry-After` sets
//! the next attempt, a panicking sender is a failed attempt, a permanent failure or the last
//! attempt parks the row (whatever its error text holds) and a person can send it again. Against the machine's PostgreSQL (`DATABASE_URL`,
//! default `postgres://postgres@127.0.0.1:5432/test`): every test works in its own schema, dropped
//! at the end, so runs never see each other.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use support::{failing_first, quick, Schema};
use tower::service_fn;
use tower_once_outbox::{OutboxMessage, OutboxRelay};
use tower_once_retry::classify::Action;

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
