//! Claims and their tokens (the store contract's fencing rules, on the `MemoryStore`): a key
//! is all of its 32 bytes, only the token that holds a claim completes, extends or releases
//! it (a claimer whose lease ended and whose key was taken over is fenced), completing moves
//! a record's expiry from its lease to its retention, and huge durations saturate.

use super::super::{lock, MemoryStore};
use super::support::{check_all, claimed, is_completed, key, pool_key, response, DAY, FP, LEASE};
use crate::store::{ClaimOutcome, ClaimToken, Completion, RecordState};
use std::time::Duration;

#[tokio::test(start_paused = true)]
async fn keys_differing_only_in_their_last_16_bytes_are_two_records() {
    let store = MemoryStore::builder()
        .max_entries(10)
        .max_bytes(10_000)
        .build();
    let (a, b) = (pool_key(0, 3), pool_key(1, 3));
    assert_eq!(a.as_bytes()[..16], b.as_bytes()[..16]);
    assert_ne!(a, b);
    let ta = claimed(&store, a);
    let tb = claimed(&store, b);
    assert!(
        !store.do_complete(a, tb, response(10), DAY),
        "b's token on a"
    );
    assert!(store.do_complete(a, ta, response(10), DAY));
    match store.do_claim(b, ClaimToken::new(), FP, LEASE) {
        Ok(ClaimOutcome::Existing(r)) => {
            assert!(matches!(r.state, RecordState::InProgress { .. }))
        }
        other => panic!("b is still a claim, got {other:?}"),
    }
    assert!(store.do_extend(b, tb, DAY));
    assert!(store.do_complete(b, tb, Completion::NotReplayable, LEASE));
    assert!(is_completed(&store, a));
    check_all(&store, "after both completed");
    assert_eq!(store.len(), 2);
}

/// `Shard::complete` changes the record in place: its expiry must move from the (extended)
/// lease to the retention in both indices, and the old claimer, once taken over, is fenced.
#[tokio::test(start_paused = true)]
async fn extend_then_complete_expires_at_the_retention_not_the_lease() {
    let store = MemoryStore::builder()
        .max_entries(10)
        .max_bytes(10_000)
        .build();
    let t = claimed(&store, key(1));
    assert!(store.do_extend(key(1), t, DAY));
    assert!(store.do_complete(key(1), t, response(100), Duration::from_secs(5)));
    check_all(&store, "completed");
    tokio::time::advance(Duration::from_secs(5)).await;
    let t2 = claimed(&store, key(1));
    check_all(&store, "reclaimed after retention");
    assert!(!store.do_complete(key(1), t, response(1), DAY), "old token");
    // The second claimer's lease runs out; a third takes over: the second is fenced.
    tokio::time::advance(LEASE).await;
    let t3 = claimed(&store, key(1));
    assert!(!store.do_extend(key(1), t2, LEASE));
    assert!(!store.do_complete(key(1), t2, response(1), DAY));
    assert!(!store.do_release(key(1), t2));
    assert!(store.do_complete(key(1), t3, response(1), DAY));
    check_all(&store, "third claimer completed");
    assert_eq!(lock(&store.inner.shards[0]).bytes(), 65);
}

#[tokio::test(start_paused = true)]
async fn huge_leases_and_retention_saturate_instead_of_panicking() {
    let store = MemoryStore::new();
    let t = ClaimToken::new();
    assert!(matches!(
        store.do_claim(key(1), t, FP, Duration::MAX),
        Ok(ClaimOutcome::Claimed)
    ));
    assert!(store.do_extend(key(1), t, Duration::MAX));
    assert!(store.do_complete(key(1), t, response(1), Duration::MAX));
    assert!(is_completed(&store, key(1)));
}
