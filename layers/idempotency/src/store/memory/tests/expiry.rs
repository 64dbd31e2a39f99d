//! Expiry (the `MemoryStore` docs and the store contract): a record past its lease or
//! retention is never answered, whichever tag the key asking for it carries; expired records
//! are dropped with their bytes, and they make room before a live record pays, also in scopes
//! nobody uses any more.

use super::super::{lock, MemoryStore};
use super::support::{
    check_all, claimed, done, is_completed, key, one_shard, peek, response, scoped, DAY, FP, LEASE,
};
use crate::fingerprint::Fingerprint;
use crate::store::{ClaimOutcome, ClaimToken, Completion, StoreKey};
use std::time::Duration;

#[tokio::test(start_paused = true)]
async fn expired_entries_are_purged_with_their_bytes() {
    let store = MemoryStore::new();
    for n in 0..50 {
        let t = ClaimToken::new();
        store.do_claim(key(n), t, FP, LEASE).unwrap();
        if n % 2 == 0 {
            assert!(store.do_complete(key(n), t, response(100), Duration::from_secs(60)));
        }
    }
    tokio::time::advance(Duration::from_secs(61)).await;
    // Any operation on a shard purges it; touch every shard through a fresh claim.
    for n in 100..=255 {
        let _ = store.do_claim(key(n), ClaimToken::new(), FP, LEASE);
    }
    assert_eq!(store.len(), 156);
    assert!(store.inner.shards.iter().all(|s| lock(s).bytes() == 0));
}

#[tokio::test(start_paused = true)]
async fn a_quiet_scopes_expired_records_make_room_before_a_live_one_pays() {
    // Expired records are dropped per scope as scopes are used; a scope nobody uses any
    // more keeps its expired records until room is needed, and then they go first.
    let store = MemoryStore::builder().max_entries(4).build();
    for n in 0..2 {
        let key = scoped(n, b"quiet");
        let t = claimed(&store, key);
        assert!(store.do_complete(key, t, response(10), Duration::from_secs(60)));
    }
    for n in 0..2 {
        let key = scoped(n, b"busy");
        let t = claimed(&store, key);
        assert!(store.do_complete(key, t, response(10), DAY));
    }
    tokio::time::advance(Duration::from_secs(61)).await;
    assert_eq!(
        store.len(),
        4,
        "the quiet scope's records are past retention, not dropped"
    );
    // Full: the quiet scope's expired records make room; the busy scope's live ones stay.
    for n in 2..4 {
        claimed(&store, scoped(n, b"busy"));
    }
    assert!(is_completed(&store, scoped(0, b"busy")));
    assert!(is_completed(&store, scoped(1, b"busy")));
    assert_eq!(store.len(), 4);
    assert!(store
        .inner
        .shards
        .iter()
        .all(|s| lock(s).scope_count() == 1));
}

#[tokio::test(start_paused = true)]
async fn a_record_past_its_retention_is_never_answered() {
    // Its scope's tag differs from the one it was stored under (a store's own key): it is
    // still past its retention.
    let store = MemoryStore::new();
    let stored = scoped(7, b"a");
    let t = claimed(&store, stored);
    assert!(store.do_complete(stored, t, response(10), Duration::from_secs(5)));
    tokio::time::advance(Duration::from_secs(5)).await;
    let same_digest = StoreKey::from_bytes(*stored.as_bytes());
    assert!(matches!(
        store.do_claim(same_digest, ClaimToken::new(), FP, LEASE),
        Ok(ClaimOutcome::Claimed)
    ));
    assert_eq!(store.len(), 1);
}

/// Exactly at its end, no record answers (no replay, no 409, no 422 from its
/// fingerprint), whichever tag the key asking for it carries: its own scope's, another
/// scope's, or tag 0 (`StoreKey::from_bytes`); and its scope's indices let it go.
#[tokio::test(start_paused = true)]
async fn no_record_answers_exactly_at_its_end_under_any_tag() {
    let other_fp = Fingerprint::from_bytes([1; 32]);
    for asked_as in [&b"a"[..], b"other", b""] {
        let store = MemoryStore::builder().max_entries(10).build();
        let (done, not_replayable, held) = (scoped(1, b"a"), scoped(2, b"a"), scoped(3, b"a"));
        let t = claimed(&store, done);
        assert!(store.do_complete(done, t, response(10), LEASE));
        let t = claimed(&store, not_replayable);
        assert!(store.do_complete(not_replayable, t, Completion::NotReplayable, LEASE));
        claimed(&store, held);
        tokio::time::advance(LEASE).await;
        for key in [done, not_replayable, held] {
            let asked = StoreKey::from_bytes(*key.as_bytes()).with_scope(asked_as);
            let answer = store.do_claim(asked, ClaimToken::new(), other_fp, LEASE);
            assert!(
                matches!(answer, Ok(ClaimOutcome::Claimed)),
                "{key:?} asked as {asked_as:?} at its end: {answer:?}"
            );
        }
        check_all(&store, "after the claims");
        assert_eq!(store.len(), 3);
    }
}

/// A completion with a retention of zero (the store's API accepts it; the layer refuses it)
/// makes no room for its response: the record is born at its end and is never answered, so
/// no other tenant's live response is dropped for it (whose retry would then get 409 instead
/// of its replay). Expired records go before a live one pays; this one is expired from the
/// start. Was broken: such a completion made room like any other.
#[tokio::test(start_paused = true)]
async fn a_record_born_at_its_end_costs_no_other_response() {
    let store = one_shard(10, 1_000);
    let b = scoped(1, b"b");
    done(&store, b, 600, DAY);
    let a = scoped(2, b"a");
    let t = claimed(&store, a);
    assert!(store.do_complete(a, t, response(600), Duration::ZERO));
    check_all(&store, "after the completion born expired");
    assert_eq!(peek(&store, a), "absent", "at its end, never answered");
    assert_eq!(
        peek(&store, b),
        "completed",
        "B's live response was dropped for a record born at its end"
    );
    // And the shard's byte count does not hold the expired response either.
    assert_eq!(lock(&store.inner.shards[0]).bytes(), 664);
}
