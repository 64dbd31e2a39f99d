//! A done step is never called again (crate docs, "What a step does": "done, same arguments |
//! nothing sent | the stored result, is_replayed"; "done or in progress, other arguments |
//! nothing sent | is_mismatch"), and what it stores is read back through the codec ("And once
//! the call returns": "a success | its result, through the Codec"; `StepError::is_codec`:
//! "the result type changed ... Nothing was sent"; `StepLayer::result_limit`: "a larger one is
//! returned, not stored, and the step is not done"). Effects are counted as calls of the tool.

mod support;

use std::sync::atomic::Ordering::SeqCst;
use std::time::Duration;
use support::{get, post, refund_id, refunds, slow_refunds, tool, Lookup, Refund};
use tower::{Layer, Service, ServiceExt};
use tower_once_idempotency::store::MemoryStore;
use tower_once_step::{Step, StepId, StepLayer};

#[tokio::test(start_paused = true)]
async fn a_done_step_replays_its_result_without_calling_the_tool() {
    let (calls, refunds) = refunds();
    let steps = StepLayer::new(MemoryStore::new()).layer(refunds);
    let id = refund_id();
    let body = r#"{"amount":40}"#;

    let first = steps
        .clone()
        .oneshot(Step::new(id.clone(), post(body)).arguments(body))
        .await
        .unwrap();
    assert!(first.is_recorded() && !first.is_replayed() && !first.waited());
    for _ in 0..5 {
        let again = steps
            .clone()
            .oneshot(Step::new(id.clone(), post(body)).arguments(body))
            .await
            .unwrap();
        assert!(again.is_replayed() && again.is_recorded() && !again.waited());
        assert_eq!(again.value(), first.value());
    }
    assert_eq!(calls.load(SeqCst), 1, "five replays, one refund");
}

#[tokio::test(start_paused = true)]
async fn a_done_step_replays_in_another_layer_over_the_same_store() {
    // A restart, or another replica: a new layer (and a new tool) over the same store.
    let store = MemoryStore::new();
    let id = refund_id();
    let (first_calls, first_tool) = refunds();
    StepLayer::new(store.clone())
        .layer(first_tool)
        .oneshot(Step::new(id.clone(), post("{}")).keyed())
        .await
        .unwrap();

    let (calls, tool) = refunds();
    let out = StepLayer::new(store)
        .layer(tool)
        .oneshot(Step::new(id, post("{}")).keyed())
        .await
        .unwrap();
    assert!(out.is_replayed());
    assert_eq!(out.value().call, 0, "the first process's result");
    assert_eq!((first_calls.load(SeqCst), calls.load(SeqCst)), (1, 0));
}

#[tokio::test(start_paused = true)]
async fn a_done_step_with_other_arguments_is_a_mismatch_and_sends_nothing() {
    let (calls, refunds) = refunds();
    let steps = StepLayer::new(MemoryStore::new()).layer(refunds);
    let id = refund_id();
    steps
        .clone()
        .oneshot(Step::new(id.clone(), post("40")).arguments("40").keyed())
        .await
        .unwrap();

    for other in ["41", "", "40 "] {
        let err = steps
            .clone()
            .oneshot(Step::new(id.clone(), post(other)).arguments(other).keyed())
            .await
            .unwrap_err();
        assert!(err.is_mismatch(), "{other:?}: {err:?}");
    }
    // A step first recorded with arguments, repeated without any: other arguments too.
    let err = steps
        .clone()
        .oneshot(Step::new(id.clone(), post("40")).keyed())
        .await
        .unwrap_err();
    assert!(err.is_mismatch(), "{err:?}");
    // JSON arguments are hashed as their bytes.
    let err = steps
        .clone()
        .oneshot(
            Step::new(id.clone(), post("40"))
                .arguments_json(&serde_json::json!({ "amount": 40 }))
                .unwrap()
                .keyed(),
        )
        .await
        .unwrap_err();
    assert!(err.is_mismatch());
    assert_eq!(calls.load(SeqCst), 1, "no mismatch sent anything");

    // And the recorded step still replays for the same arguments.
    let out = steps
        .oneshot(Step::new(id, post("40")).arguments("40").keyed())
        .await
        .unwrap();
    assert!(out.is_replayed());
    assert_eq!(calls.load(SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn other_arguments_while_the_step_is_in_progress_are_a_mismatch_at_once() {
    let (calls, refunds) = slow_refunds(Duration::from_secs(5));
    let steps = StepLayer::new(MemoryStore::new()).layer(refunds);
    let id = refund_id();

    let first = tokio::spawn(
        steps
            .clone()
            .oneshot(Step::new(id.clone(), post("40")).arguments("40").keyed()),
    );
    tokio::task::yield_now().await;
    assert_eq!(calls.load(SeqCst), 1, "the first step is under way");

    let start = tokio::time::Instant::now();
    let err = steps
        .clone()
        .oneshot(Step::new(id.clone(), post("99")).arguments("99").keyed())
        .await
        .unwrap_err();
    assert!(err.is_mismatch(), "{err:?}");
    assert_eq!(
        start.elapsed(),
        Duration::ZERO,
        "no wait for the other step"
    );

    let first = first.await.unwrap().unwrap();
    assert!(first.is_recorded());
    assert_eq!(calls.load(SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn the_occurrence_tool_and_position_each_name_another_step() {
    let (calls, refunds) = refunds();
    let steps = StepLayer::new(MemoryStore::new()).layer(refunds);
    let base = refund_id();
    let ids = [
        base.clone(),
        base.clone().occurrence(1),
        StepId::new("run-1", 3, "refund"),
        StepId::new("run-1", 2, "refund-v2"),
        StepId::new("run-2", 2, "refund"),
    ];
    for id in &ids {
        let out = steps
            .clone()
            .oneshot(Step::new(id.clone(), get()))
            .await
            .unwrap();
        assert!(!out.is_replayed(), "{id}");
    }
    assert_eq!(calls.load(SeqCst), ids.len());
    for id in &ids {
        let out = steps
            .clone()
            .oneshot(Step::new(id.clone(), get()))
            .await
            .unwrap();
        assert!(out.is_replayed(), "{id}");
    }
    assert_eq!(calls.load(SeqCst), ids.len());
}

#[tokio::test(start_paused = true)]
async fn a_stored_result_read_as_another_type_is_a_codec_error_and_sends_nothing() {
    // The tool's result type changed between two deployments: `Refund` was stored, a `u64`
    // is expected now.
    let store = MemoryStore::new();
    let id = refund_id();
    let (_, old) = refunds();
    StepLayer::new(store.clone())
        .layer(old)
        .oneshot(Step::new(id.clone(), Lookup("A7")))
        .await
        .unwrap();

    let (calls, new) = tool(|_: Lookup, n| async move { Ok::<u64, std::io::Error>(n as u64) });
    let mut steps = StepLayer::new(store).layer(new);
    for _ in 0..2 {
        let err = steps
            .ready()
            .await
            .unwrap()
            .call(Step::new(id.clone(), Lookup("A7")))
            .await
            .unwrap_err();
        assert!(err.is_codec(), "{err:?}");
        assert!(
            tower_once_core::unsent::Unsent::is_unsent(&err),
            "a codec error says nothing was sent"
        );
    }
    assert_eq!(calls.load(SeqCst), 0, "the changed tool was never called");
}

#[tokio::test(start_paused = true)]
async fn a_keyed_result_over_the_limit_is_returned_not_recorded_and_called_again() {
    let (calls, big) = tool(|_: http::Request<String>, n| async move {
        Ok::<_, std::io::Error>(format!("{n}{}", "x".repeat(4096)))
    });
    let steps = StepLayer::new(MemoryStore::new())
        .result_limit(1024)
        .layer(big);
    let id = StepId::new("run-1", 2, "report");

    let first = steps
        .clone()
        .oneshot(Step::new(id.clone(), post("{}")).keyed())
        .await
        .unwrap();
    assert!(!first.is_recorded() && !first.is_replayed());
    assert!(first.value().starts_with('0'), "the result is returned");
    let second = steps
        .clone()
        .oneshot(Step::new(id, post("{}")).keyed())
        .await
        .unwrap();
    assert!(!second.is_recorded() && !second.is_replayed() && !second.waited());
    assert_eq!(
        calls.load(SeqCst),
        2,
        "the step was not done: the keyed call went again"
    );
}

#[tokio::test(start_paused = true)]
async fn an_unkeyed_result_over_the_limit_is_never_sent_twice() {
    // The effect happened and its result could not be kept: for a call that may not be sent
    // twice, the next attempt must not send it (future.rs: "an unkeyed call's mark stays").
    let (calls, big) =
        tool(
            |_: http::Request<String>, _| async move { Ok::<_, std::io::Error>("x".repeat(4096)) },
        );
    let steps = StepLayer::new(MemoryStore::new())
        .result_limit(1024)
        .layer(big);
    let id = refund_id();

    let first = steps
        .clone()
        .oneshot(Step::new(id.clone(), post("{}")))
        .await
        .unwrap();
    assert!(!first.is_recorded());
    for _ in 0..2 {
        let err = steps
            .clone()
            .oneshot(Step::new(id.clone(), post("{}")))
            .await
            .unwrap_err();
        assert!(err.is_unknown(), "{err:?}");
        assert_eq!(err.idempotency_key(), Some(id.idempotency_key().as_str()));
    }
    assert_eq!(calls.load(SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_limit_that_holds_the_result_records_it_and_a_zero_limit_keeps_nothing() {
    let (zero_calls, zero_tool) = refunds();
    let nothing = StepLayer::new(MemoryStore::new())
        .result_limit(0)
        .layer(zero_tool);
    let id = refund_id();
    for _ in 0..2 {
        let out = nothing
            .clone()
            .oneshot(Step::new(id.clone(), get()))
            .await
            .unwrap();
        assert!(!out.is_recorded());
    }
    assert_eq!(
        zero_calls.load(SeqCst),
        2,
        "an idempotent GET not recorded runs again"
    );

    let (calls, tool_) = refunds();
    let steps = StepLayer::new(MemoryStore::new())
        .result_limit(4096)
        .layer(tool_);
    steps
        .clone()
        .oneshot(Step::new(id.clone(), get()))
        .await
        .unwrap();
    let again = steps.oneshot(Step::new(id, get())).await.unwrap();
    assert_eq!(
        again.value(),
        &Refund {
            status: 201,
            call: 0
        }
    );
    assert!(again.is_replayed());
    assert_eq!(calls.load(SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_record_past_its_retention_runs_again() {
    let (calls, refunds) = refunds();
    let steps = StepLayer::new(MemoryStore::new())
        .retention(Duration::from_secs(60))
        .layer(refunds);
    let id = refund_id();
    steps
        .clone()
        .oneshot(Step::new(id.clone(), get()))
        .await
        .unwrap();
    tokio::time::advance(Duration::from_secs(59)).await;
    let out = steps
        .clone()
        .oneshot(Step::new(id.clone(), get()))
        .await
        .unwrap();
    assert!(out.is_replayed());
    tokio::time::advance(Duration::from_secs(2)).await;
    let out = steps.oneshot(Step::new(id, get())).await.unwrap();
    assert!(!out.is_replayed(), "retention passed: the step runs again");
    assert_eq!(calls.load(SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn a_result_whose_json_does_not_read_back_is_not_recorded_and_never_sent_twice() {
    // `Json`: "a value whose JSON does not read back (a NaN or infinite float, written as
    // `null`) is refused, so the step is not recorded rather than recorded unreadable". The
    // call may not be sent twice (its request says so), so the next attempt does not send it.
    #[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
    struct Score {
        ratio: f64,
    }
    let (calls, scorer) = tool(|_: Lookup, _| async move {
        Ok::<_, std::io::Error>(Score {
            ratio: f64::INFINITY,
        })
    });
    let steps = StepLayer::new(MemoryStore::new()).layer(scorer);
    let id = StepId::new("run-1", 2, "score");
    let first = steps
        .clone()
        .oneshot(Step::new(id.clone(), Lookup("A7")))
        .await
        .unwrap();
    assert!(!first.is_recorded(), "an unreadable result is not recorded");
    assert_eq!(first.value().ratio, f64::INFINITY, "but returned");
    let again = steps.oneshot(Step::new(id, Lookup("A7"))).await;
    assert!(again.is_err_and(|e| e.is_unknown()));
    assert_eq!(calls.load(SeqCst), 1);
}
