//! What an operation costs (the `MemoryStore` docs: "each shard keeps its scopes ranked ... so
//! a full store finds who pays, and what expired, in logarithmic time however many scopes
//! (tenants) it holds"): the scopes an operation visits one by one stay bounded per operation,
//! amortized, and the heaps stay proportional to the scopes, whatever the pattern.

use super::super::{lock, MemoryStore};
use super::support::{
    check_all, claimed, done, is_completed, one_shard, response, scoped, visits_of, DAY, LEASE,
};
use crate::store::StoreKey;
use std::time::Duration;

/// Fills a one-shard store with one 100-byte response in each of `scopes` scopes (bytes
/// full), and returns the keys.
fn one_record_per_scope(store: &MemoryStore, scopes: u32) -> Vec<StoreKey> {
    (0..scopes)
        .map(|n| {
            let key = scoped(n, format!("tenant-{n}").as_bytes());
            let t = claimed(store, key);
            assert!(store.do_complete(key, t, response(36), DAY));
            key
        })
        .collect()
}

/// Was broken: `do_complete` chose each victim for bytes with `Shard::victim`, a scan of
/// every scope of the shard, once per record it evicted. One response that needs the room
/// of k records in a shard of s scopes cost k * s (here 200 * 200 scope visits under the
/// shard's lock; with the default bounds a 1 MiB response over ~6 000 one-record tenants is
/// millions), where the contract allows a scan of the scopes when full.
#[tokio::test(start_paused = true)]
async fn making_room_for_one_response_scans_the_scopes_a_bounded_number_of_times() {
    const SCOPES: u32 = 200;
    let store = MemoryStore::builder()
        .max_entries(500)
        .max_bytes(SCOPES as usize * 100)
        .build();
    assert_eq!(store.inner.shards.len(), 1);
    let bystanders = one_record_per_scope(&store, SCOPES);
    let big = scoped(0, b"big");
    let t = claimed(&store, big);
    let (done, visits) = visits_of(|| store.do_complete(big, t, response(200 * 100 - 64), DAY));
    assert!(done);
    check_all(&store, "after the big response");
    assert!(
        is_completed(&store, big),
        "the response fits once the others went"
    );
    assert!(bystanders.iter().all(|k| !is_completed(&store, *k)));
    assert_eq!(store.len(), SCOPES as usize + 1, "their keys are kept");
    assert!(
        visits <= 2 * SCOPES as usize,
        "one completion visited {visits} scopes (the shard holds {SCOPES})"
    );
}

/// Was broken: every claim in a full shard scanned all of its scopes twice (once for
/// expired records, once for who pays), under the shard's lock. With one record per tenant
/// (a scope per user) and the default bounds, a store full of ~6 000 scopes per shard cost
/// about 1 ms per new key. Now the scopes are ranked as they change: what a claim or a
/// completion visits is bounded per operation, amortized, however many scopes there are.
#[tokio::test(start_paused = true)]
async fn a_full_shard_of_many_scopes_is_never_scanned_per_operation() {
    const SCOPES: u32 = 500;
    let store = MemoryStore::builder()
        .max_entries(SCOPES as usize)
        .max_bytes(SCOPES as usize * 100)
        .build();
    assert_eq!(store.inner.shards.len(), 1);
    one_record_per_scope(&store, SCOPES);
    let ((), visits) = visits_of(|| {
        for n in 0..SCOPES {
            // A new tenant, a new key: room by entries, then by bytes.
            let key = scoped(n, format!("new-{n}").as_bytes());
            let t = claimed(&store, key);
            assert!(store.do_complete(key, t, response(36), DAY));
        }
    });
    check_all(&store, "after the new tenants");
    assert!(
        visits <= 8 * SCOPES as usize,
        "{SCOPES} claims and completions visited {visits} scopes"
    );
}

/// Expired records in scopes nobody uses any more still make room first, and
/// finding them visits no scope one by one.
#[tokio::test(start_paused = true)]
async fn expired_records_of_idle_scopes_make_room_without_a_scan() {
    let store = MemoryStore::builder().max_entries(300).build();
    for n in 0..300u32 {
        let key = scoped(n, format!("idle-{n}").as_bytes());
        let t = claimed(&store, key);
        let retention = if n % 2 == 0 {
            Duration::from_secs(60)
        } else {
            DAY
        };
        assert!(store.do_complete(key, t, response(10), retention));
    }
    tokio::time::advance(Duration::from_secs(61)).await;
    let ((), visits) = visits_of(|| {
        for n in 0..150u32 {
            claimed(&store, scoped(n, b"busy"));
        }
    });
    check_all(&store, "after the busy claims");
    for n in 0..300u32 {
        let key = scoped(n, format!("idle-{n}").as_bytes());
        assert_eq!(is_completed(&store, key), n % 2 == 1, "idle record {n}");
    }
    assert!(visits <= 8 * 150, "150 claims visited {visits} scopes");
}

/// The shard's scopes and the pairs each heap holds (entries, bytes, expiry).
fn heaps(store: &MemoryStore) -> (usize, [usize; 3]) {
    let shard = lock(&store.inner.shards[0]);
    (shard.scope_count(), shard.heap_lens())
}

/// Asserts that no heap holds more than a rebuild allows for `scopes` scopes.
fn assert_bounded(store: &MemoryStore, scopes: usize, context: &str) {
    let (_, lens) = heaps(store);
    for (name, len) in ["entries", "bytes", "expiry"].iter().zip(lens) {
        assert!(
            len <= 2 * scopes + 33,
            "{context}: the {name} heap holds {len} pairs for at most {scopes} scopes"
        );
    }
}

/// The heaps stay within the rebuild bound of the most scopes the shard held, whatever
/// the pattern: thousands of scopes created and removed (claims released), ranks oscillating
/// in place (claim / release storms on two scopes, complete / expire on one), whole
/// generations of scopes expiring at once (time jumps), extension storms. And once the scopes
/// are gone, the next change of rank rebuilds each heap down to what remains. Fails when the
/// rebuild is removed (the heaps grow by one pair per change of rank, without bound).
#[tokio::test(start_paused = true)]
async fn the_heaps_stay_proportional_to_the_scopes_under_churn() {
    // Scopes created and removed: 40 generations of 50 scopes, each claimed then released.
    let store = one_shard(256, 1 << 20);
    for generation in 0..40u32 {
        let keys: Vec<_> = (0..50u32)
            .map(|n| scoped(n, format!("g{generation}-{n}").as_bytes()))
            .collect();
        let tokens: Vec<_> = keys.iter().map(|key| claimed(&store, *key)).collect();
        assert_bounded(&store, 50, "claims of a generation");
        for (key, token) in keys.iter().zip(tokens) {
            assert!(store.do_release(*key, token));
        }
        assert_bounded(&store, 50, "releases of a generation");
    }
    check_all(&store, "after the generations");
    // Nothing pushed since the scopes went: the heaps still hold their pairs. The next change
    // of rank rebuilds the heap it changes.
    let t = claimed(&store, scoped(0, b"last"));
    assert!(store.do_complete(scoped(0, b"last"), t, response(10), DAY));
    assert_bounded(&store, 1, "one scope left");

    // Ranks oscillating: claim / release storms on two scopes, completions expiring in place.
    let store = one_shard(256, 1 << 20);
    let (a, b) = (scoped(1, b"a"), scoped(2, b"b"));
    done(&store, scoped(3, b"a"), 10, DAY);
    for round in 0..5_000u32 {
        let key = if round % 2 == 0 { a } else { b };
        let t = claimed(&store, key);
        if round % 3 == 0 {
            assert!(store.do_complete(key, t, response(10 + round as usize % 50), LEASE));
            tokio::time::advance(LEASE).await;
        } else {
            for _ in 0..3 {
                assert!(store.do_extend(key, t, LEASE));
            }
            assert!(store.do_release(key, t));
        }
        assert_bounded(&store, 2, "oscillating ranks");
    }
    check_all(&store, "after the oscillations");

    // Generations of scopes expiring at once: a full shard, then a time jump past them all,
    // then a new generation makes room from the expired ones.
    let store = one_shard(256, 1 << 20);
    for generation in 0..30u32 {
        for n in 0..256u32 {
            let key = scoped(n, format!("x{generation}-{}", n % 200).as_bytes());
            done(
                &store,
                key,
                10 + n as usize % 7,
                Duration::from_secs(1 + u64::from(n % 3)),
            );
            assert_bounded(&store, 256, "a generation filling the shard");
        }
        tokio::time::advance(Duration::from_secs(4)).await;
    }
    check_all(&store, "after the time jumps");
}

/// Rebuilds stay paid for by the changes of rank before them when the scopes shrink and
/// grow back: half of 2 000 scopes released then claimed again, over and over (each time the
/// heaps hold far more pairs than the scopes left), and whole generations expiring at once
/// in a full shard. Fails when a heap is rebuilt as soon as it holds more pairs than scopes
/// (threshold `scopes + 1`): a visit of every scope per operation.
#[tokio::test(start_paused = true)]
async fn shrinking_and_growing_scopes_cost_no_scan_per_operation() {
    const SCOPES: u32 = 2_000;
    let store = one_shard(SCOPES as usize, 1 << 24);
    let keys: Vec<_> = (0..SCOPES)
        .map(|n| scoped(n, format!("tenant-{n}").as_bytes()))
        .collect();
    let mut tokens: Vec<_> = keys.iter().map(|key| claimed(&store, *key)).collect();
    let mut ops = 0;
    let ((), visits) = visits_of(|| {
        for round in 0..6 {
            // Half the scopes go (no pair is pushed for a scope that goes), then come back.
            let half = if round % 2 == 0 {
                0..SCOPES / 2
            } else {
                SCOPES / 2..SCOPES
            };
            for n in half.clone() {
                assert!(store.do_release(keys[n as usize], tokens[n as usize]));
                ops += 1;
            }
            for n in half {
                tokens[n as usize] = claimed(&store, keys[n as usize]);
                ops += 1;
            }
        }
    });
    assert!(
        visits <= 4 * ops,
        "{ops} releases and claims visited {visits} scopes"
    );
    check_all(&store, "after the churn");

    let store = one_shard(SCOPES as usize, 1 << 24);
    let mut ops = 0;
    let mut visits = 0;
    for generation in 0..4u32 {
        let ((), v) = visits_of(|| {
            for n in 0..SCOPES {
                let key = scoped(n, format!("g{generation}-{n}").as_bytes());
                let t = claimed(&store, key);
                assert!(store.do_complete(key, t, response(10), Duration::from_secs(1)));
                ops += 2;
            }
        });
        visits += v;
        tokio::time::advance(Duration::from_secs(2)).await;
    }
    assert!(
        visits <= 4 * ops,
        "{ops} claims and completions visited {visits} scopes"
    );
    check_all(&store, "after the generations");
}
