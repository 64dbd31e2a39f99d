//! Steps kept in a bounded `MemoryStore` (crate docs: "The step's record lives in any
//! IdempotencyStore: memory, ..."; "done, same arguments | nothing sent"; "a success | its
//! result ... kept for the retention (7 days)"; "recorded as unknown | nothing sent |
//! is_unknown again"). The memory store makes room when it is full by evicting completed
//! records (its entry bound) or dropping their responses (its byte bound): what must a step
//! still promise then? Small bounds stand for the defaults (100 000 entries, 256 MiB) reached.

mod support;

use std::sync::atomic::Ordering::SeqCst;
use std::time::Duration;
use support::{get, kill_after, post, refund_id, refunds, tool};
use tower::{Layer, ServiceExt};
use tower_once_idempotency::store::MemoryStore;
use tower_once_step::{Step, StepId, StepLayer};

#[tokio::test(start_paused = true)]
async fn a_done_unkeyed_step_is_never_sent_again_when_the_memory_store_fills_up() {
    // A refund done, then other steps of other runs (each keeps a record for 7 days). When
    // the store is full the refund's record is evicted, and a retry of that step (a run
    // resumed later, in the same process) sends the unkeyed POST a second time.
    let store = MemoryStore::builder().max_entries(8).build();
    let (calls, tool_) = refunds();
    let steps = StepLayer::new(store.clone()).layer(tool_);
    let refund = refund_id();
    steps
        .clone()
        .oneshot(Step::new(refund.clone(), post("40")))
        .await
        .unwrap();

    let (_, lookups) = refunds();
    let others = StepLayer::new(store).layer(lookups);
    for run in 0..8 {
        tokio::time::advance(Duration::from_secs(60)).await;
        others
            .clone()
            .oneshot(Step::new(
                StepId::new(format!("run-{run}"), 1, "lookup"),
                get(),
            ))
            .await
            .unwrap();
    }

    let again = steps.oneshot(Step::new(refund, post("40"))).await;
    assert_eq!(
        calls.load(SeqCst),
        1,
        "the refund was sent twice within its retention: {again:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn an_unknown_step_stays_unknown_when_the_memory_store_fills_up() {
    // Its "sent" mark is a claim in progress, which the store never evicts.
    let store = MemoryStore::builder().max_entries(8).build();
    let (calls, hanging) = support::hanging_refunds();
    let steps = StepLayer::new(store.clone())
        .lease(Duration::from_secs(1))
        .layer(hanging);
    let refund = refund_id();
    kill_after(
        steps.clone().oneshot(Step::new(refund.clone(), post("40"))),
        Duration::from_millis(10),
    )
    .await;
    let err = steps
        .clone()
        .oneshot(Step::new(refund.clone(), post("40")))
        .await
        .unwrap_err();
    assert!(err.is_unknown());

    let (_, lookups) = refunds();
    let others = StepLayer::new(store).layer(lookups);
    for run in 0..8 {
        tokio::time::advance(Duration::from_secs(60)).await;
        let _ = others
            .clone()
            .oneshot(Step::new(
                StepId::new(format!("run-{run}"), 1, "lookup"),
                get(),
            ))
            .await;
    }
    let err = steps
        .oneshot(Step::new(refund, post("40")))
        .await
        .unwrap_err();
    assert!(err.is_unknown(), "{err:?}");
    assert_eq!(calls.load(SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_result_the_memory_store_cannot_hold_is_never_sent_again() {
    // Over the store's byte bound, the record is kept without its result ("not replayable"):
    // the step cannot be replayed, and must not be sent again either.
    let store = MemoryStore::builder().max_bytes(1024).build();
    let (calls, big) = tool(|_: http::Request<String>, _| async move {
        Ok::<_, std::io::Error>("x".repeat(8 * 1024))
    });
    let steps = StepLayer::new(store).layer(big);
    let id = StepId::new("run-1", 2, "report");
    let first = steps
        .clone()
        .oneshot(Step::new(id.clone(), post("40")))
        .await
        .unwrap();
    assert_eq!(first.value().len(), 8 * 1024);
    for step in [
        Step::new(id.clone(), post("40")),
        Step::new(id.clone(), post("40")).keyed(),
    ] {
        let err = steps.clone().oneshot(step).await.unwrap_err();
        assert!(err.is_codec(), "{err:?}");
    }
    assert_eq!(calls.load(SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn sent_marks_that_fill_the_memory_store_refuse_unkeyed_steps_and_send_nothing() {
    // Costs: "An unkeyed step's sent mark stays for the retention, an in-progress claim that
    // no store drops to make room ...: on the memory store, size max_entries for the unkeyed
    // steps of a retention". The memory store: "when every entry is in progress the claim
    // fails with StoreError::full". Past that size: done records are evicted for marks (their
    // steps, repeated, are settled unknown: Known limits), then every fresh unkeyed step fails
    // closed with nothing sent, until the marks' retention ends. A keyed step still runs in
    // the one entry left, and its record goes with the next claim (Known limits: it runs again
    // with its key).
    let store = MemoryStore::builder().max_entries(8).build();
    let (calls, tool_) = refunds();
    let steps = StepLayer::new(store.clone()).layer(tool_);
    let refund = |run: usize| Step::new(StepId::new(format!("run-{run}"), 2, "refund"), post("40"));
    let mut refused_at = None;
    for run in 0..16 {
        tokio::time::advance(Duration::from_secs(60)).await;
        match steps.clone().oneshot(refund(run)).await {
            Ok(out) => assert!(out.is_recorded(), "run {run}: {out:?}"),
            Err(err) => {
                assert!(err.is_store(), "run {run}: {err:?}");
                refused_at.get_or_insert(run);
            }
        }
    }
    let refused_at = refused_at.expect("the marks filled the store");
    assert_eq!(refused_at, 7, "seven marks and one entry for a record");
    assert_eq!(
        calls.load(SeqCst),
        refused_at,
        "a refused step sent nothing"
    );
    // The first refund's record made room for a mark: repeated, it is unknown, never sent.
    let err = steps.clone().oneshot(refund(0)).await.unwrap_err();
    assert!(err.is_unknown(), "{err:?}");

    let keyed = Step::new(StepId::new("run-99", 1, "lookup"), post("1")).keyed();
    assert!(steps
        .clone()
        .oneshot(keyed.clone())
        .await
        .unwrap()
        .is_recorded());
    let err = steps.clone().oneshot(refund(50)).await.unwrap_err();
    assert!(err.is_store(), "{err:?}");
    let again = steps.clone().oneshot(keyed.clone()).await.unwrap();
    assert!(
        !again.is_replayed(),
        "its record made room for the refused claim"
    );
    assert_eq!(calls.load(SeqCst), refused_at + 2);

    // Once the marks' retention (7 days) has passed, unkeyed steps run again.
    tokio::time::advance(tower_once_step::DEFAULT_RETENTION).await;
    assert!(steps.oneshot(refund(50)).await.unwrap().is_recorded());
    assert_eq!(calls.load(SeqCst), refused_at + 3);
}
