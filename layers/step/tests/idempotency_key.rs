//! The key a step carries downstream (`Step::keyed`: "Carries the step's key downstream
//! (`idempotency_key`, as `Idempotency-Key` for HTTP, stamped when the step is called), so a
//! second send is answered by the first one's effect ... A request that already carries a key
//! keeps it"; `Step::idempotency_key`: "The key the step carries downstream when keyed: derived
//! from the step id and its scope"; `StepError::idempotency_key`: "The key the unknown call
//! carried (or would have carried) downstream"). What the tool saw is recorded per call.

mod support;

use std::sync::atomic::Ordering::SeqCst;

use std::time::Duration;
use support::{keeping_keys, kill_after, post, refund_id, Refund};
use tower::{Layer, ServiceExt};
use tower_once_idempotency::store::MemoryStore;
use tower_once_step::{OnUnknown, Step, StepLayer};

const LEASE: Duration = Duration::from_secs(2);

/// A refunds tool that keeps the `Idempotency-Key` of every call; its first call never
/// answers when `first_hangs`, and every call fails with a timeout when `times_out`.
fn refunds(
    first_hangs: bool,
    times_out: bool,
) -> (
    support::Calls,
    support::Keys,
    impl support::RefundTool<http::Request<String>>,
) {
    keeping_keys(move |call| async move {
        if first_hangs && call == 0 {
            std::future::pending::<()>().await;
        }
        if times_out {
            return Err(std::io::Error::from(std::io::ErrorKind::TimedOut));
        }
        Ok(Refund { status: 201, call })
    })
}

/// `POST /refunds` carrying a key of the caller's own.
fn post_with_key(key: &'static str) -> http::Request<String> {
    let mut request = post("40");
    request
        .headers_mut()
        .insert("idempotency-key", http::HeaderValue::from_static(key));
    request
}

#[tokio::test(start_paused = true)]
async fn a_request_with_its_own_key_is_sent_with_it_every_time() {
    let (calls, keys, refunds) = refunds(true, false);
    let steps = StepLayer::new(MemoryStore::new())
        .lease(LEASE)
        .layer(refunds);
    let id = refund_id();
    let step = || Step::new(id.clone(), post_with_key("order-77")).keyed();
    assert_eq!(step().on_unknown_policy(), OnUnknown::RunAgain);
    kill_after(steps.clone().oneshot(step()), Duration::from_millis(10)).await;
    let out = steps.oneshot(step()).await.unwrap();
    assert!(out.is_recorded() && out.waited());
    let own = Some("order-77".to_owned());
    assert_eq!(*keys.lock().unwrap(), vec![own.clone(), own]);
    assert_eq!(calls.load(SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn keyed_before_its_scope_carries_the_scoped_key() {
    // Stamped when the step is called: the scope set after `keyed` counts.
    let (calls, keys, refunds) = refunds(false, false);
    let steps = StepLayer::new(MemoryStore::new()).scoped().layer(refunds);
    let id = refund_id();
    let a_late = Step::new(id.clone(), post("40")).keyed().scope("tenant-a");
    let a_early = Step::new(id.clone(), post("40")).scope("tenant-a").keyed();
    let b_late = Step::new(id.clone(), post("40")).keyed().scope("tenant-b");
    let expected = [
        a_late.idempotency_key(),
        a_early.idempotency_key(),
        b_late.idempotency_key(),
    ];
    assert_eq!(expected[0], expected[1]);
    assert_ne!(expected[0], expected[2]);
    assert_ne!(expected[0], id.idempotency_key(), "the scope is in the key");
    for step in [a_late, b_late] {
        assert!(!steps.clone().oneshot(step).await.unwrap().is_replayed());
    }
    assert!(steps.oneshot(a_early).await.unwrap().is_replayed());
    assert_eq!(
        *keys.lock().unwrap(),
        vec![Some(expected[0].clone()), Some(expected[2].clone())]
    );
    assert_eq!(calls.load(SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn step_idempotency_key_is_the_key_the_request_carries() {
    // `Step::idempotency_key`: "The key the step carries downstream when keyed". A request
    // with a key of its own keeps it, so that is the key a caller must look the call up by.
    let (_, keys, refunds) = refunds(false, false);
    let steps = StepLayer::new(MemoryStore::new()).layer(refunds);
    let step = Step::new(refund_id(), post_with_key("order-77")).keyed();
    let named = step.idempotency_key();
    steps.oneshot(step).await.unwrap();
    let carried = keys.lock().unwrap()[0].clone();
    assert_eq!(
        Some(named),
        carried,
        "the step names one key and carries another"
    );
}

#[tokio::test(start_paused = true)]
async fn an_unknown_call_names_the_key_it_carried() {
    // `StepError::idempotency_key`: "The key the unknown call carried (or would have carried)
    // downstream", given so the caller can look the call up. A request with a key of its own,
    // kept unsendable twice (the downstream is not known to honour keys): the error names the
    // step's derived key, which never travelled.
    let (calls, keys, refunds) = refunds(false, true);
    let steps = StepLayer::new(MemoryStore::new()).layer(refunds);
    let id = refund_id();
    let err = steps
        .oneshot(Step::new(id, post_with_key("order-77")).on_unknown(OnUnknown::Refuse))
        .await
        .unwrap_err();
    assert!(err.is_unknown(), "{err:?}");
    assert_eq!(keys.lock().unwrap()[0].as_deref(), Some("order-77"));
    assert_eq!(
        err.idempotency_key(),
        Some("order-77"),
        "the error names a key the call never carried"
    );
    assert_eq!(calls.load(SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn an_unknown_scoped_step_names_its_scoped_key() {
    // The same error for a tenant's unkeyed step: "would have carried" is the step's scoped
    // key (`Step::idempotency_key`, what `keyed` stamps), and every attempt names the same.
    let (calls, _, refunds) = refunds(false, true);
    let steps = StepLayer::new(MemoryStore::new()).scoped().layer(refunds);
    let id = refund_id();
    let step = || Step::new(id.clone(), post("40")).scope("tenant-a");
    let would_carry = step().keyed().idempotency_key();
    for _ in 0..2 {
        let err = steps.clone().oneshot(step()).await.unwrap_err();
        assert!(err.is_unknown(), "{err:?}");
        assert_eq!(
            err.idempotency_key(),
            Some(would_carry.as_str()),
            "the unscoped key, {}, shared by every tenant's run-1",
            id.idempotency_key()
        );
    }
    assert_eq!(calls.load(SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn an_empty_idempotency_key_header_is_not_a_key() {
    // `Step::keyed` keeps a key the request already carries, and the policy becomes RunAgain
    // ("the second send has the effect of the first"). An empty `Idempotency-Key` (a template
    // that filled in nothing) is no key: no downstream can dedupe by it (the idempotency
    // layer refuses it as invalid, others ignore it), yet it is kept and the killed call is
    // sent again under it.
    let (calls, keys, refunds) = refunds(true, false);
    let steps = StepLayer::new(MemoryStore::new())
        .lease(LEASE)
        .layer(refunds);
    let id = refund_id();
    let step = || Step::new(id.clone(), post_with_key("")).keyed();
    kill_after(steps.clone().oneshot(step()), Duration::from_millis(10)).await;
    let again = steps.oneshot(step()).await;
    let keys = keys.lock().unwrap().clone();
    assert!(
        keys.iter()
            .all(|k| k.as_deref().is_some_and(|k| !k.is_empty())),
        "sent {} times, with keys {keys:?} ({again:?})",
        calls.load(SeqCst)
    );
}
