//! Ids and scopes a caller (or a model choosing a tool's arguments) gets wrong on purpose
//! (`MAX_ID_LEN`: "Longer ones are refused (StepError::is_invalid)"; `StepError::is_invalid`
//! and `is_missing_scope`: "Nothing was sent"; `StepId::idempotency_key`: "different for every
//! (run, step, tool, occurrence)"; `StepLayer::scoped`: "Every step must carry a scope ...;
//! one without is refused, nothing sent. Steps of two scopes never share a record"), and a
//! record under a step's key that is not a step's.

mod support;

use std::collections::HashSet;
use std::sync::atomic::Ordering::SeqCst;
use std::time::Duration;
use support::{claim_as_another, get, no_arguments, post, record_key, refund_id, refunds};
use tower::{Layer, ServiceExt};
use tower_once_core::unsent::Unsent;
use tower_once_idempotency::store::{
    ClaimToken, Completion, IdempotencyStore, MemoryStore, StoredResponse,
};
use tower_once_step::{Step, StepId, StepLayer, MAX_ID_LEN};

#[tokio::test(start_paused = true)]
async fn a_run_or_tool_over_max_id_len_is_invalid_and_sends_nothing() {
    let (calls, refunds) = refunds();
    let steps = StepLayer::new(MemoryStore::new()).layer(refunds);
    let long = "r".repeat(MAX_ID_LEN + 1);
    for id in [
        StepId::new(long.clone(), 1, "refund"),
        StepId::new("run-1", 1, long.clone()),
        StepId::new("é".repeat(MAX_ID_LEN / 2 + 1), 1, "refund"), // bytes, not chars
    ] {
        let err = steps
            .clone()
            .oneshot(Step::new(id.clone(), post("40")))
            .await
            .unwrap_err();
        assert!(err.is_invalid(), "{err:?}");
        assert!(err.is_unsent());
        // Not even a claim: a valid step with the same key would have been waited for.
    }
    assert_eq!(calls.load(SeqCst), 0);

    // At the limit, and at the extremes of the numbers: fine.
    let edge = "r".repeat(MAX_ID_LEN);
    for id in [
        StepId::new(edge.clone(), u32::MAX, edge.clone()).occurrence(u32::MAX),
        StepId::new("", 0, ""),
    ] {
        let out = steps.clone().oneshot(Step::new(id, get())).await.unwrap();
        assert!(out.is_recorded());
    }
    assert_eq!(calls.load(SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn ids_that_print_alike_never_share_a_record_or_a_key() {
    // Each pair prints the same through `Display` ("run/step/tool#occurrence").
    let pairs = [
        (StepId::new("a/1", 1, "x"), StepId::new("a", 1, "1/x")),
        (
            StepId::new("a", 1, "x#1"),
            StepId::new("a", 1, "x").occurrence(1),
        ),
        (StepId::new("a/1", 2, "x"), StepId::new("a", 1, "2/x")),
        (StepId::new("ab", 1, "c"), StepId::new("a", 1, "bc")),
        (StepId::new("", 1, "x"), StepId::new("", 1, "x\0")),
    ];
    let (calls, refunds) = refunds();
    let steps = StepLayer::new(MemoryStore::new()).layer(refunds);
    let mut keys = HashSet::new();
    for (a, b) in &pairs {
        if a.to_string() == b.to_string() {
            // (The last pair differs in print; it is here for its NUL.)
            assert_ne!(a, b);
        }
        for id in [a, b] {
            assert!(keys.insert(id.idempotency_key()), "{id:?}");
            let out = steps
                .clone()
                .oneshot(Step::new(id.clone(), post("40")).arguments(id.to_string()))
                .await
                .unwrap();
            assert!(!out.is_replayed(), "{id:?} replayed another step's result");
        }
    }
    assert_eq!(calls.load(SeqCst), pairs.len() * 2);
}

#[tokio::test(start_paused = true)]
async fn a_scoped_layer_refuses_a_step_without_a_scope_and_sends_nothing() {
    let (calls, refunds) = refunds();
    let steps = StepLayer::new(MemoryStore::new()).scoped().layer(refunds);
    let id = refund_id();
    let err = steps
        .clone()
        .oneshot(Step::new(id.clone(), post("40")).keyed())
        .await
        .unwrap_err();
    assert!(err.is_missing_scope(), "{err:?}");
    assert!(err.is_unsent());
    let out = steps
        .oneshot(Step::new(id, post("40")).keyed().scope("tenant-a"))
        .await
        .unwrap();
    assert!(out.is_recorded());
    assert_eq!(calls.load(SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn two_scopes_never_share_a_record() {
    let (calls, refunds) = refunds();
    let steps = StepLayer::new(MemoryStore::new()).scoped().layer(refunds);
    let id = refund_id();
    // Scopes that would run together if they were only concatenated with the run id.
    let scopes: [&[u8]; 5] = [
        b"tenant-a",
        b"tenant-b",
        b"tenant-a\0",
        b"t",
        b"tenant-a/run-1",
    ];
    for (i, scope) in scopes.iter().enumerate() {
        // Other arguments per scope: no mismatch across scopes either.
        let args = format!("{i}");
        let out = steps
            .clone()
            .oneshot(
                Step::new(id.clone(), post(&args))
                    .arguments(&args)
                    .keyed()
                    .scope(scope),
            )
            .await
            .unwrap();
        assert!(!out.is_replayed(), "scope {scope:?} replayed another's");
        assert_eq!(out.value().call, i);
    }
    for (i, scope) in scopes.iter().enumerate() {
        let args = format!("{i}");
        let out = steps
            .clone()
            .oneshot(
                Step::new(id.clone(), post(&args))
                    .arguments(&args)
                    .keyed()
                    .scope(scope),
            )
            .await
            .unwrap();
        assert!(out.is_replayed());
        assert_eq!(
            out.value().call,
            i,
            "scope {scope:?} replays its own result"
        );
    }
    assert_eq!(calls.load(SeqCst), scopes.len());
}

#[tokio::test(start_paused = true)]
async fn a_scoped_layer_refuses_an_empty_scope() {
    // An empty scope is no tenant's: with it, a scoped layer's step shares the record of every
    // unscoped step (the sibling idempotency layer treats an empty scope as missing, "so the
    // shared scope ... is never a tenant's own").
    let store = MemoryStore::new();
    let id = refund_id();
    let (_, unscoped_tool) = refunds();
    StepLayer::new(store.clone())
        .layer(unscoped_tool)
        .oneshot(Step::new(id.clone(), post("40")).keyed())
        .await
        .unwrap();

    let (calls, scoped_tool) = refunds();
    let out = StepLayer::new(store)
        .scoped()
        .layer(scoped_tool)
        .oneshot(Step::new(id, post("40")).keyed().scope(""))
        .await;
    match out {
        Err(err) => assert!(err.is_missing_scope(), "{err:?}"),
        Ok(out) => panic!(
            "an empty scope was taken as a scope (replayed another layer's unscoped step: {})",
            out.is_replayed()
        ),
    }
    assert_eq!(calls.load(SeqCst), 0);
}

#[tokio::test(start_paused = true)]
async fn a_record_under_the_steps_key_that_is_not_a_steps_sends_nothing() {
    // Another layer's record (or a corrupted one) under the step's key: a codec error, never
    // a call.
    let store = MemoryStore::new();
    let id = refund_id();
    let key = record_key(&id, b"");
    let token = claim_as_another(&store, key, no_arguments(), Duration::from_secs(5)).await;
    let foreign = StoredResponse::new(http::StatusCode::OK, Default::default(), "{}".into());
    let day = Duration::from_secs(24 * 3600);
    assert!(store
        .complete(key, token, Completion::Response(foreign), day)
        .await
        .unwrap());

    let (calls, refunds) = refunds();
    let err = StepLayer::new(store.clone())
        .layer(refunds)
        .oneshot(Step::new(id.clone(), post("40")).keyed())
        .await
        .unwrap_err();
    assert!(err.is_codec(), "{err:?}");
    assert_eq!(calls.load(SeqCst), 0);
    // The key the tests derive is the layer's: claiming it again finds the record.
    let again = store
        .claim(
            key,
            ClaimToken::new(),
            no_arguments(),
            Duration::from_secs(5),
        )
        .await
        .unwrap();
    assert!(matches!(
        again,
        tower_once_idempotency::store::ClaimOutcome::Existing(_)
    ));
}

#[tokio::test(start_paused = true)]
async fn two_scopes_never_send_the_same_idempotency_key() {
    // `StepLayer::scoped`: "Steps of two scopes never share a record"; `Step::keyed`: the key
    // makes "a second send ... answered by the first one's effect". Two tenants whose runs are
    // numbered alike ("run-1" each) are two steps; with one key, a downstream that dedupes by
    // key (one payments account for the platform) answers tenant B's refund with tenant A's.
    let (calls, keys, refunds) =
        support::keeping_keys(|call| async move { Ok(support::Refund { status: 201, call }) });
    let steps = StepLayer::new(MemoryStore::new()).scoped().layer(refunds);
    let id = refund_id();
    for tenant in ["tenant-a", "tenant-b"] {
        // The scope first, then the key (so the step could know its scope when keyed).
        let step = Step::new(id.clone(), post("40")).scope(tenant).keyed();
        let out = steps.clone().oneshot(step).await.unwrap();
        assert!(!out.is_replayed());
    }
    assert_eq!(calls.load(SeqCst), 2);
    let keys = keys.lock().unwrap();
    assert!(keys.iter().all(Option::is_some));
    assert_ne!(
        keys[0], keys[1],
        "two tenants' refunds carried one Idempotency-Key"
    );
}

#[tokio::test(start_paused = true)]
async fn durations_of_centuries_neither_panic_nor_overflow() {
    // A `max_wait` and a lease as long as a `Duration` holds: a configuration, never a panic.
    let (calls, refunds) = refunds();
    let steps = StepLayer::new(MemoryStore::new())
        .max_wait(Duration::MAX)
        .lease(Duration::MAX)
        .retention(Duration::MAX)
        .layer(refunds);
    let first = steps
        .clone()
        .oneshot(Step::new(refund_id(), post("40")).keyed())
        .await
        .unwrap();
    assert!(first.is_recorded());
    let again = steps
        .oneshot(Step::new(refund_id(), post("40")).keyed())
        .await
        .unwrap();
    assert!(again.is_replayed());
    assert_eq!(calls.load(SeqCst), 1);
}
