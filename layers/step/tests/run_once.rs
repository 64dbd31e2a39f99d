//! `RunOnceLayer` over a message that is not a worker's job: any type that says which effect
//! it names and which delivery it is runs once per id, on the step mechanism.

use sha2::{Digest, Sha256};
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use tower::{Layer, ServiceExt};
use tower_once_idempotency::fingerprint::Fingerprint;
use tower_once_idempotency::store::{MemoryStore, StoreKey};
use tower_once_step::run_once::{Delivery, RunOnceLayer, RunOnceOutcome};
use tower_once_step::StepRequest;

/// An event from some queue: `id` names its effect, `receipt` the delivery.
#[derive(Debug, Clone)]
struct Event {
    id: &'static str,
    receipt: &'static str,
}

impl StepRequest for Event {}

impl Delivery for Event {
    fn once_key(&self) -> StoreKey {
        let digest = Sha256::new()
            .chain_update("events/v1\0")
            .chain_update(self.id);
        StoreKey::from_bytes(digest.finalize().into())
    }

    fn delivery(&self) -> Fingerprint {
        Fingerprint::from_bytes(Sha256::digest(self.receipt).into())
    }
}

fn event(id: &'static str, receipt: &'static str) -> Event {
    Event { id, receipt }
}

#[tokio::test(start_paused = true)]
async fn an_event_delivered_three_times_runs_once_and_a_failure_runs_again() {
    let calls = Arc::new(AtomicUsize::new(0));
    let failures_left = Arc::new(AtomicUsize::new(1));
    let (c, f) = (calls.clone(), failures_left.clone());
    let handler = tower::service_fn(move |e: Event| {
        let (c, f) = (c.clone(), f.clone());
        async move {
            c.fetch_add(1, SeqCst);
            if e.id == "flaky" && f.fetch_sub(1, SeqCst) == 1 {
                return Err(std::io::Error::other("the mail server said 451"));
            }
            Ok::<_, std::io::Error>(e.id)
        }
    });
    let events = RunOnceLayer::new(MemoryStore::new()).layer(handler);

    let first = events.clone().oneshot(event("paid-7", "r1")).await.unwrap();
    assert_eq!(first, RunOnceOutcome::Done("paid-7"));
    for receipt in ["r1", "r2"] {
        let again = events
            .clone()
            .oneshot(event("paid-7", receipt))
            .await
            .unwrap();
        assert!(again.is_duplicate(), "{receipt}: the handler does not run");
    }
    assert_eq!(calls.load(SeqCst), 1);

    let failed = events
        .clone()
        .oneshot(event("flaky", "r1"))
        .await
        .unwrap_err();
    assert!(failed.is_inner(), "{failed}");
    let rerun = events.clone().oneshot(event("flaky", "r1")).await.unwrap();
    assert_eq!(
        rerun,
        RunOnceOutcome::Done("flaky"),
        "the failure released the id"
    );
    assert_eq!(calls.load(SeqCst), 3);
}

#[tokio::test(start_paused = true)]
async fn while_it_runs_its_own_delivery_is_in_progress_and_another_message_a_duplicate() {
    let (started, release) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let calls = Arc::new(AtomicUsize::new(0));
    let (s, r, c) = (started.clone(), release.clone(), calls.clone());
    let handler = tower::service_fn(move |_: Event| {
        let (s, r, c) = (s.clone(), r.clone(), c.clone());
        async move {
            c.fetch_add(1, SeqCst);
            s.notify_one();
            r.notified().await;
            Ok::<_, std::io::Error>(())
        }
    });
    let events = RunOnceLayer::new(MemoryStore::new())
        .lease(Duration::from_secs(3))
        .layer(handler);
    let running = tokio::spawn(events.clone().oneshot(event("paid-8", "r1")));
    started.notified().await;
    // Past several leases: the running claim is renewed, never taken over.
    tokio::time::sleep(Duration::from_secs(10)).await;

    let same = events
        .clone()
        .oneshot(event("paid-8", "r1"))
        .await
        .unwrap_err();
    assert!(same.is_in_progress(), "not waited for: {same}");
    let other = events.clone().oneshot(event("paid-8", "r2")).await.unwrap();
    assert!(other.is_duplicate());

    release.notify_one();
    assert_eq!(running.await.unwrap().unwrap(), RunOnceOutcome::Done(()));
    assert_eq!(calls.load(SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_run_dropped_mid_handler_frees_its_id_at_once() {
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let handler = tower::service_fn(move |_: Event| {
        let c = c.clone();
        async move {
            if c.fetch_add(1, SeqCst) == 0 {
                std::future::pending::<()>().await;
            }
            Ok::<_, std::io::Error>(())
        }
    });
    let events = RunOnceLayer::new(MemoryStore::new()).layer(handler);
    let cut = tokio::time::timeout(
        Duration::from_millis(50),
        events.clone().oneshot(event("paid-9", "r1")),
    )
    .await;
    assert!(cut.is_err(), "the first run never ends");
    tokio::task::yield_now().await; // the release runs on a task of its own
    let again = events.oneshot(event("paid-9", "r1")).await.unwrap();
    assert_eq!(again, RunOnceOutcome::Done(()), "no lease to wait out");
    assert_eq!(calls.load(SeqCst), 2);
}
