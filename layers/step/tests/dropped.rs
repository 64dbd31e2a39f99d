//! A step whose future is dropped, by a caller's timeout or an aborted task (crate docs, "And
//! once the call returns": "the step's future dropped (a caller's timeout) | released, or
//! unknown for Refuse (on a task of its own)"; "What a step does": "an earlier attempt sent,
//! never recorded | ... Refuse sends nothing"; `StepError::is_unknown`: "An attempt of this
//! step was sent and its outcome never recorded"). Dropped mid-call, mid-wait, and while a
//! store's reply is on the way (a store whose writes land before their replies come back, as
//! Redis's do).

mod support;

use std::sync::atomic::Ordering::SeqCst;
use std::time::Duration;
use support::{
    first_calls_hang, hanging_refunds, post, refund_id, settle, Late, Refund, SlowReplies,
};
use tower::{Layer, ServiceExt};
use tower_once_idempotency::store::MemoryStore;
use tower_once_step::{Step, StepId, StepLayer};

#[tokio::test(start_paused = true)]
async fn a_keyed_step_dropped_mid_call_is_released_and_the_next_attempt_sends_at_once() {
    let (calls, refunds) = first_calls_hang(1);
    let steps = StepLayer::new(MemoryStore::new()).layer(refunds);
    let id = refund_id();
    let timed_out = tokio::time::timeout(
        Duration::from_secs(1),
        steps
            .clone()
            .oneshot(Step::new(id.clone(), post("40")).keyed()),
    )
    .await;
    assert!(timed_out.is_err());
    settle().await;

    let out = steps
        .clone()
        .oneshot(Step::new(id.clone(), post("40")).keyed())
        .await
        .unwrap();
    assert!(!out.waited(), "released: no lease to wait out");
    assert!(out.is_recorded() && out.value().call == 1);
    assert_eq!(calls.load(SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn an_unkeyed_step_dropped_mid_call_is_recorded_unknown_and_never_sent_again() {
    let (calls, refunds) = first_calls_hang(1);
    let steps = StepLayer::new(MemoryStore::new()).layer(refunds);
    let id = refund_id();
    let timed_out = tokio::time::timeout(
        Duration::from_secs(1),
        steps.clone().oneshot(Step::new(id.clone(), post("40"))),
    )
    .await;
    assert!(timed_out.is_err());
    settle().await;

    for _ in 0..3 {
        let err = steps
            .clone()
            .oneshot(Step::new(id.clone(), post("40")))
            .await
            .unwrap_err();
        assert!(err.is_unknown(), "{err:?}");
    }
    assert_eq!(calls.load(SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn an_unkeyed_step_retried_the_instant_it_is_dropped_is_still_never_sent_twice() {
    // The retry comes before the dropped step's task records it unknown.
    let (calls, refunds) = first_calls_hang(1);
    let steps = StepLayer::new(MemoryStore::new()).layer(refunds);
    let id = refund_id();
    let _ = tokio::time::timeout(
        Duration::from_secs(1),
        steps.clone().oneshot(Step::new(id.clone(), post("40"))),
    )
    .await;
    let err = steps.oneshot(Step::new(id, post("40"))).await.unwrap_err();
    assert!(err.is_unknown(), "{err:?}");
    assert_eq!(calls.load(SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_step_aborted_on_its_task_is_released_or_recorded_unknown() {
    // The first two calls never answer; later ones do.
    let (calls, refunds) = first_calls_hang(2);
    let steps = StepLayer::new(MemoryStore::new()).layer(refunds);
    let keyed = refund_id();
    let unkeyed = StepId::new("run-1", 3, "refund");
    let tasks = [
        tokio::spawn(
            steps
                .clone()
                .oneshot(Step::new(keyed.clone(), post("40")).keyed()),
        ),
        tokio::spawn(
            steps
                .clone()
                .oneshot(Step::new(unkeyed.clone(), post("40"))),
        ),
    ];
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(calls.load(SeqCst), 2);
    for task in tasks {
        task.abort();
        assert!(task.await.unwrap_err().is_cancelled());
    }
    settle().await;

    let out = steps
        .clone()
        .oneshot(Step::new(keyed, post("40")).keyed())
        .await
        .unwrap();
    assert!(out.is_recorded() && !out.waited());
    let err = steps
        .oneshot(Step::new(unkeyed, post("40")))
        .await
        .unwrap_err();
    assert!(err.is_unknown());
    assert_eq!(
        calls.load(SeqCst),
        3,
        "the keyed step twice, the unkeyed once"
    );
}

#[tokio::test(start_paused = true)]
async fn a_waiter_dropped_while_waiting_sends_nothing_and_leaves_the_owner_alone() {
    let (calls, refunds) = support::slow_refunds(Duration::from_secs(3));
    let steps = StepLayer::new(MemoryStore::new()).layer(refunds);
    let id = refund_id();
    let owner = tokio::spawn(steps.clone().oneshot(Step::new(id.clone(), post("40"))));
    tokio::task::yield_now().await;
    for _ in 0..3 {
        let waiting = tokio::time::timeout(
            Duration::from_millis(500),
            steps.clone().oneshot(Step::new(id.clone(), post("40"))),
        )
        .await;
        assert!(waiting.is_err());
    }
    settle().await;
    let out = owner.await.unwrap().unwrap();
    assert!(
        out.is_recorded(),
        "the waiters' drops freed nothing of the owner's"
    );
    let again = steps.oneshot(Step::new(id, post("40"))).await.unwrap();
    assert!(again.is_replayed());
    assert_eq!(calls.load(SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_step_dropped_while_its_claim_is_on_the_way_is_released() {
    // The claim lands in the store, the caller's timeout drops the step before the reply comes
    // back: nothing was sent, and the step must be free for the next attempt (not held for a
    // whole lease by a claim nobody owns any more).
    let store = SlowReplies::new(Duration::from_millis(50));
    let (calls, refunds) = support::refunds();
    let steps = StepLayer::new(store.clone()).layer(refunds); // lease 10 s
    let id = refund_id();

    store.late(Late::RecordClaims);
    let timed_out = tokio::time::timeout(
        Duration::from_millis(20),
        steps
            .clone()
            .oneshot(Step::new(id.clone(), post("40")).keyed()),
    )
    .await;
    assert!(timed_out.is_err());
    assert!(store.landed.load(SeqCst), "the claim took effect");
    assert_eq!(calls.load(SeqCst), 0, "nothing was sent");
    store.late(Late::Nothing);
    settle().await;
    tokio::time::sleep(Duration::from_millis(100)).await; // the late reply has come and gone

    let out = steps
        .oneshot(Step::new(id, post("40")).keyed())
        .await
        .unwrap();
    assert!(
        !out.waited(),
        "the next attempt waited out the lease of a claim its dropped predecessor left behind"
    );
    assert_eq!(calls.load(SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn an_unkeyed_step_dropped_before_it_was_sent_is_not_reported_sent() {
    // The "sent" mark lands, the caller's timeout drops the step before the mark's reply comes
    // back: the tool was never called, yet `is_unknown` says "an attempt of this step was sent
    // and its outcome never recorded", with a `sent_at`, for the whole retention (7 days).
    let store = SlowReplies::new(Duration::from_millis(50));
    let (calls, refunds) = support::refunds();
    let steps = StepLayer::new(store.clone()).layer(refunds);
    let id = refund_id();

    store.late(Late::MarkClaims);
    let timed_out = tokio::time::timeout(
        Duration::from_millis(20),
        steps.clone().oneshot(Step::new(id.clone(), post("40"))),
    )
    .await;
    assert!(timed_out.is_err());
    assert!(store.landed.load(SeqCst), "the mark took effect");
    assert_eq!(calls.load(SeqCst), 0, "nothing was sent");
    store.late(Late::Nothing);
    settle().await;
    tokio::time::sleep(Duration::from_millis(100)).await;

    let out = steps.oneshot(Step::new(id, post("40"))).await;
    assert!(
        out.is_ok(),
        "a step never sent is reported as sent and unknown: {:?}",
        out.unwrap_err()
    );
    assert_eq!(calls.load(SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_step_dropped_before_its_first_poll_claims_nothing() {
    let store = MemoryStore::new();
    let (calls, refunds) = hanging_refunds();
    let mut steps = StepLayer::new(store.clone()).layer(refunds);
    let id = refund_id();
    let never_polled = tower::Service::call(
        steps.ready().await.unwrap(),
        Step::new(id.clone(), post("40")),
    );
    drop(never_polled);
    settle().await;
    let (later_calls, later) = support::refunds();
    let out = StepLayer::new(store)
        .layer(later)
        .oneshot(Step::new(id, post("40")))
        .await
        .unwrap();
    assert!(!out.waited());
    assert_eq!((calls.load(SeqCst), later_calls.load(SeqCst)), (0, 1));
}

#[tokio::test(start_paused = true)]
async fn a_step_dropped_while_its_result_is_being_recorded_is_still_recorded() {
    // Store contract: "If the layer's future is dropped mid-operation, it spawns the pending
    // future on the current tokio runtime so the operation is not lost"; crate docs: "the
    // step's future dropped (a caller's timeout) | released, on a task of its own". The tool
    // answered, the step is writing its result (the store's connection is a moment away), and
    // the caller's timeout drops it: the completion is dropped with it, the record stays in
    // progress, and the next attempt waits out the whole lease and sends the call again.
    let store = SlowReplies::new(Duration::from_millis(50));
    let (calls, refunds) = support::slow_refunds(Duration::from_millis(900));
    let steps = StepLayer::new(store.clone()).layer(refunds); // lease 10 s
    let id = refund_id();

    store.late(Late::Completions);
    let timed_out = tokio::time::timeout(
        Duration::from_millis(920), // the tool answers at 900 ms, the write lands at 950 ms
        steps
            .clone()
            .oneshot(Step::new(id.clone(), post("40")).keyed()),
    )
    .await;
    assert!(timed_out.is_err());
    assert_eq!(calls.load(SeqCst), 1, "the tool answered");
    store.late(Late::Nothing);
    settle().await;
    tokio::time::sleep(Duration::from_millis(100)).await;

    let start = tokio::time::Instant::now();
    let out = steps
        .oneshot(Step::new(id, post("40")).keyed())
        .await
        .unwrap();
    assert!(
        out.is_replayed(),
        "the answered call's result was lost with the dropped write: sent again after waiting {:?} (waited: {})",
        start.elapsed(),
        out.waited()
    );
    assert_eq!(calls.load(SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_step_dropped_while_it_asks_the_downstream_is_released_and_keeps_its_mark() {
    // "the step's future dropped | released, on a task of its own; an unkeyed call's sent
    // mark stays, so the next attempt settles it": here the drop comes while the verify hook
    // looks the timed-out call up downstream.
    let (calls, refunds) = support::timing_out();
    let lookups = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = std::sync::Arc::clone(&lookups);
    let steps = StepLayer::new(MemoryStore::new())
        .verify(move |_: &StepId, _: std::time::SystemTime| {
            let n = counted.fetch_add(1, SeqCst);
            async move {
                if n == 0 {
                    std::future::pending::<()>().await; // the first lookup never answers
                }
                tower_once_step::Verified::<Refund>::Unknown
            }
        })
        .layer(refunds);
    let id = refund_id();
    let cut = tokio::time::timeout(
        Duration::from_secs(1),
        steps.clone().oneshot(Step::new(id.clone(), post("40"))),
    )
    .await;
    assert!(cut.is_err(), "dropped during its lookup");
    settle().await;

    let start = tokio::time::Instant::now();
    let err = steps.oneshot(Step::new(id, post("40"))).await.unwrap_err();
    assert!(err.is_unknown(), "{err:?}");
    assert_eq!(
        start.elapsed(),
        Duration::ZERO,
        "released, no lease to wait out"
    );
    assert_eq!((calls.load(SeqCst), lookups.load(SeqCst)), (1, 2));
}
