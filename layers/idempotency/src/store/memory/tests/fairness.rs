//! Fair between scopes (the `MemoryStore` docs): when room must be made, the scope that holds
//! the most (entries, or bytes for the byte bound) pays with its oldest completed record; the
//! claimer's own scope counts as that scope whenever it holds as much as any other, and when
//! the scope that pays has nothing to give the claimer pays or is refused, never a bystander.

use super::super::MemoryStore;
use super::support::{
    check_all, claimed, done, is_completed, one_shard, peek, response, scoped, DAY, FP, LEASE,
};
use crate::store::ClaimToken;
use std::time::Duration;

#[tokio::test(start_paused = true)]
async fn a_flooding_scope_evicts_only_its_own_records() {
    let store = MemoryStore::builder().max_entries(1_000).build();
    let payment = scoped(0, b"tenant-b");
    let t = claimed(&store, payment);
    assert!(store.do_complete(payment, t, response(10), DAY));
    for n in 0..1_200 {
        let key = scoped(n, b"tenant-a");
        let t = claimed(&store, key);
        assert!(store.do_complete(key, t, response(10), DAY));
    }
    assert!(
        is_completed(&store, payment),
        "tenant B's completed payment survived tenant A's flood"
    );
    assert!(store.len() <= 1_000);
}

#[tokio::test(start_paused = true)]
async fn a_small_scope_makes_room_at_the_largest_ones_expense() {
    let store = MemoryStore::builder().max_entries(4).build();
    for n in 0..4 {
        let key = scoped(n, b"a");
        let t = claimed(&store, key);
        assert!(store.do_complete(key, t, response(10), DAY));
    }
    // B holds nothing: A, the largest, pays its oldest record.
    claimed(&store, scoped(0, b"b"));
    assert!(!is_completed(&store, scoped(0, b"a")));
    assert!(is_completed(&store, scoped(3, b"a")));
}

#[tokio::test(start_paused = true)]
async fn a_scope_holding_only_claims_is_refused_not_paid_for() {
    let store = MemoryStore::builder().max_entries(3).build();
    let done = scoped(0, b"b");
    let t = claimed(&store, done);
    assert!(store.do_complete(done, t, response(10), DAY));
    claimed(&store, scoped(0, b"a"));
    claimed(&store, scoped(1, b"a"));
    // A holds the most and has no completed record to give: it is refused.
    let err = store
        .do_claim(scoped(2, b"a"), ClaimToken::new(), FP, LEASE)
        .unwrap_err();
    assert!(err.is_full());
    assert!(is_completed(&store, done));
}

/// Room for bytes is taken from a larger scope only while it holds strictly more
/// than the claimer: here B (300 + 200 bytes) pays its oldest for A (200 bytes), then,
/// holding as much as A, keeps its other record while A pays with its own; C (100 bytes,
/// smaller) is never touched.
#[tokio::test(start_paused = true)]
async fn byte_room_is_taken_from_a_larger_scope_only_while_it_holds_strictly_more() {
    let store = MemoryStore::builder()
        .max_entries(10)
        .max_bytes(1_000)
        .build();
    let mut stored = Vec::new();
    for (n, scope, len) in [
        (1, b"b", 236),
        (2, b"b", 136),
        (3, b"a", 136),
        (4, b"c", 36),
    ] {
        let key = scoped(n, scope);
        let t = claimed(&store, key);
        assert!(store.do_complete(key, t, response(len), DAY));
        stored.push(key);
        tokio::time::advance(Duration::from_secs(1)).await;
    }
    let [b_old, b_new, a_old, c] = stored[..] else {
        unreachable!()
    };
    let new = scoped(5, b"a");
    let t = claimed(&store, new);
    assert!(store.do_complete(new, t, response(636), DAY));
    check_all(&store, "after A's response");
    assert!(is_completed(&store, new), "A's response fits");
    assert!(!is_completed(&store, b_old), "B held more than A: it paid");
    assert!(
        !is_completed(&store, a_old),
        "then A held as much as B: A paid"
    );
    assert!(
        is_completed(&store, b_new),
        "B paid again while it held no more than A"
    );
    assert!(is_completed(&store, c), "C, smaller, paid");
}

/// A claimer holding exactly as much as the largest other scope pays with its own
/// records, whichever of the two tags is larger (ties in a heap are broken by the tag): for
/// entries and for bytes, tried with the claimer on each side of the tie. The bystander keeps
/// its record and its response.
#[tokio::test(start_paused = true)]
async fn a_claimer_tied_with_the_largest_pays_itself_on_either_side_of_the_tie() {
    for (claimer, other) in [(&b"x"[..], &b"y"[..]), (b"y", b"x")] {
        // Entries: both hold two completed records; the claimer's third claim evicts its own.
        let store = one_shard(4, 1 << 20);
        let mine: Vec<_> = (0..2u32).map(|n| scoped(n, claimer)).collect();
        let theirs: Vec<_> = (0..2u32).map(|n| scoped(n, other)).collect();
        for (m, t) in mine.iter().zip(&theirs) {
            done(&store, *m, 10, DAY);
            done(&store, *t, 10, DAY);
        }
        claimed(&store, scoped(5, claimer));
        check_all(&store, "the claimer's third claim");
        assert!(theirs.iter().all(|k| peek(&store, *k) == "completed"));
        assert_eq!(
            peek(&store, mine[0]),
            "absent",
            "the claimer paid its oldest"
        );

        // Bytes: both hold 300 bytes; the claimer's new response (200) demotes its own.
        let store = one_shard(16, 700);
        let (m, t) = (scoped(0, claimer), scoped(0, other));
        done(&store, m, 236, DAY);
        done(&store, t, 236, DAY);
        let new = scoped(1, claimer);
        let token = claimed(&store, new);
        assert!(store.do_complete(new, token, response(136), DAY));
        check_all(&store, "the claimer's response");
        assert_eq!(
            peek(&store, t),
            "completed",
            "the bystander kept its response"
        );
        assert_eq!(peek(&store, m), "not-replayable", "the claimer paid");
        assert_eq!(peek(&store, new), "completed");
    }
}
