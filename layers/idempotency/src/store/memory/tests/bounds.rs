//! The two bounds of the `MemoryStore` docs: entries (a full store evicts the completed record
//! closest to expiry and never an in-progress claim: it refuses with `StoreError::full`
//! instead) and bytes of stored responses (a response that must go leaves its key, not
//! replayable; one that cannot fit is kept as not replayable and evicts nothing).

use super::super::{lock, MemoryStore};
use super::support::{claimed, is_completed, key, response, DAY, FP, LEASE};
use crate::store::{ClaimOutcome, ClaimToken, RecordState};

#[tokio::test(start_paused = true)]
async fn full_of_claims_refuses_and_evicts_completed_first() {
    let store = MemoryStore::builder().max_entries(2).build();
    let (t1, t2) = (ClaimToken::new(), ClaimToken::new());
    assert!(matches!(
        store.do_claim(key(1), t1, FP, LEASE),
        Ok(ClaimOutcome::Claimed)
    ));
    assert!(matches!(
        store.do_claim(key(2), t2, FP, LEASE),
        Ok(ClaimOutcome::Claimed)
    ));
    let err = store
        .do_claim(key(3), ClaimToken::new(), FP, LEASE)
        .unwrap_err();
    assert!(err.is_full(), "in-progress claims are never evicted");
    assert_eq!(store.len(), 2);

    assert!(store.do_complete(key(1), t1, response(10), DAY));
    let t3 = ClaimToken::new();
    assert!(matches!(
        store.do_claim(key(3), t3, FP, LEASE),
        Ok(ClaimOutcome::Claimed)
    ));
    assert_eq!(store.len(), 2);
    // key 1 (completed) was evicted, key 2 (in progress) kept its claim.
    assert!(matches!(
        store.do_claim(key(1), ClaimToken::new(), FP, LEASE),
        Err(e) if e.is_full()
    ));
    assert!(store.do_release(key(2), t2));
}

#[tokio::test(start_paused = true)]
async fn byte_bound_drops_old_responses_but_keeps_their_keys() {
    // Few entries: one shard, so the whole byte budget applies to these keys.
    let store = MemoryStore::builder()
        .max_entries(10)
        .max_bytes(1_000)
        .build();
    let (t1, t2, t3) = (ClaimToken::new(), ClaimToken::new(), ClaimToken::new());
    store.do_claim(key(1), t1, FP, LEASE).unwrap();
    assert!(store.do_complete(key(1), t1, response(600), DAY));
    store.do_claim(key(2), t2, FP, LEASE).unwrap();
    assert!(store.do_complete(key(2), t2, response(600), DAY));
    // key 1 made room for key 2: its response went, its key stays (its handler ran).
    match store.do_claim(key(1), ClaimToken::new(), FP, LEASE) {
        Ok(ClaimOutcome::Existing(r)) => assert!(matches!(r.state, RecordState::NotReplayable)),
        other => panic!("expected key 1 kept as not replayable, got {other:?}"),
    }
    assert!(is_completed(&store, key(2)));
    store.do_claim(key(3), t3, FP, LEASE).unwrap();
    assert!(store.do_complete(key(3), t3, response(5_000), DAY));
    match store.do_claim(key(3), ClaimToken::new(), FP, LEASE) {
        Ok(ClaimOutcome::Existing(r)) => assert!(matches!(r.state, RecordState::NotReplayable)),
        other => panic!("expected a not-replayable record, got {other:?}"),
    }
    assert!(store.inner.shards.iter().all(|s| lock(s).bytes() <= 1_000));
}

#[tokio::test(start_paused = true)]
async fn a_response_too_big_for_the_shard_evicts_nothing() {
    let store = MemoryStore::builder()
        .max_entries(10)
        .max_bytes(1_000)
        .build();
    let t1 = claimed(&store, key(1));
    assert!(store.do_complete(key(1), t1, response(600), DAY));
    let t2 = claimed(&store, key(2));
    assert!(store.do_complete(key(2), t2, response(5_000), DAY));
    assert!(
        is_completed(&store, key(1)),
        "the earlier response is still replayable"
    );
    match store.do_claim(key(2), ClaimToken::new(), FP, LEASE) {
        Ok(ClaimOutcome::Existing(r)) => assert!(matches!(r.state, RecordState::NotReplayable)),
        other => panic!("expected a not-replayable record, got {other:?}"),
    }
}
