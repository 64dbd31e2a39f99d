//! Random sequences against a model (the store contract and the `MemoryStore` docs): after
//! every random claim, completion, release, extension or jump in time, the shard's indices
//! and counts agree with its records, a live claim is never lost, a stale or foreign token
//! never writes, a completed record never outlives its retention, what is found is what was
//! written, and what was evicted respects the share (`evictions.rs`).

use super::super::entry::State;
use super::super::MemoryStore;
use super::evictions::{before, check_evictions, Room};
use super::support::{check_all, pool_key, response, XorShift, DAY, FP, LEASE, SCOPES};
use crate::store::{ClaimOutcome, ClaimToken, Completion, RecordState, StoreKey};
use std::time::Duration;
use tokio::time::Instant;
use tower_once_core::time::saturating_add;

#[derive(Clone, Copy, Debug)]
enum Model {
    Absent,
    Held {
        token: ClaimToken,
        lease_end: Instant,
    },
    Done {
        expires: Instant,
        replayable: bool,
    },
}

/// Runs `steps` random claim / complete / release / extend / expiry steps against `store`
/// with keys of `scopes` scopes, checking after each one that the shard indices and byte
/// counts agree with `map`, that every live claim is in the map under its token, that what
/// was evicted respects the share (`check_evictions`), and against a model: a live claim is
/// never lost (evicted), a stale or foreign token never writes, a completed record never
/// outlives its retention (also when asked for under another scope's tag), and what is
/// found is what was written.
async fn random_sequence(store: MemoryStore, seed: u64, steps: usize, scopes: usize) {
    // With room for every key, the entry bound never evicts: a record can only go by
    // expiry, or (one holding bytes) for the byte bound.
    const KEYS: usize = 24;
    let roomy = store.inner.max_entries_per_shard >= KEYS;
    let mut rng = XorShift(seed);
    let mut model = [Model::Absent; KEYS];
    let mut stale: Vec<(usize, ClaimToken)> = Vec::new();
    for step in 0..steps {
        let i = rng.below(KEYS);
        let key = pool_key(i, scopes);
        let now = Instant::now();
        let op = rng.below(9);
        let context = format!("seed {seed} step {step} op {op} key {i}");
        let snapshot = before(&store, &key, now);
        let mut room = None;
        match op {
            0 | 1 => {
                let token = ClaimToken::new();
                let lease = Duration::from_secs([5, 30][rng.below(2)]);
                // Now and then the same digest under another tag (a store's own key, tag
                // 0, or another tenant's): the record's own scope still decides.
                let asked = match rng.below(6) {
                    0 => StoreKey::from_bytes(*key.as_bytes()),
                    1 => key.with_scope(SCOPES[rng.below(SCOPES.len())]),
                    _ => key,
                };
                match store.do_claim(asked, token, FP, lease) {
                    Ok(ClaimOutcome::Claimed) => {
                        room = Some(Room::Entries {
                            claimer: asked.scope_tag(),
                        });
                        match model[i] {
                            Model::Held { lease_end, .. } => assert!(
                                lease_end <= now,
                                "{context}: a live claim was lost (evicted or dropped)"
                            ),
                            // Bytes never cost a record its key: with room for every
                            // key, a completed record goes only at its end.
                            Model::Done { expires, .. } if roomy => assert!(
                                expires <= now,
                                "{context}: a completed record was forgotten before its retention"
                            ),
                            Model::Done { .. } | Model::Absent => {}
                        }
                        if let Model::Held { token: old, .. } = model[i] {
                            stale.push((i, old));
                        }
                        model[i] = Model::Held {
                            token,
                            lease_end: saturating_add(now, lease),
                        };
                    }
                    Ok(ClaimOutcome::Existing(record)) => match (model[i], record.state) {
                        (Model::Held { lease_end, .. }, RecordState::InProgress { .. }) => {
                            assert!(lease_end > now, "{context}: an expired lease is kept")
                        }
                        (
                            Model::Done {
                                expires,
                                replayable,
                            },
                            state,
                        ) => {
                            assert!(
                                expires > now,
                                "{context}: a completed record outlived its retention"
                            );
                            match state {
                                RecordState::Completed(_) => assert!(replayable, "{context}"),
                                // Its response may have gone for bytes (checked by
                                // `check_evictions` when it went); its key stays.
                                RecordState::NotReplayable => {
                                    model[i] = Model::Done {
                                        expires,
                                        replayable: false,
                                    };
                                }
                                RecordState::InProgress { .. } => {
                                    panic!("{context}: completed record is in progress")
                                }
                            }
                        }
                        (m, state) => panic!("{context}: model {m:?}, store {state:?}"),
                    },
                    Err(e) => {
                        assert!(e.is_full(), "{context}: {e:?}");
                        if let Model::Held { lease_end, .. } = model[i] {
                            assert!(lease_end <= now, "{context}: own live claim refused");
                        }
                    }
                }
            }
            2 | 3 => {
                let Model::Held { token, lease_end } = model[i] else {
                    // A token that never claimed this key never completes it.
                    let completed = store.do_complete(key, ClaimToken::new(), response(1), DAY);
                    assert!(!completed, "{context}: a foreign token completed a record");
                    check_evictions(&store, &key, now, &snapshot, None, &context);
                    check_all(&store, &context);
                    continue;
                };
                let (completion, size) = match rng.below(5) {
                    0 => (Completion::NotReplayable, None),
                    1 => (response(10), Some(74)),
                    2 => (response(200), Some(264)),
                    3 => (response(700), Some(764)),
                    _ => (response(5_000), Some(5_064)),
                };
                let retention = Duration::from_secs([0, 1, 20, 60, 300][rng.below(5)]);
                let claimer = store.shard(&key).get(&key).map(|e| e.scope);
                let done = store.do_complete(key, token, completion, retention);
                assert_eq!(done, lease_end > now, "{context}: complete (lease live?)");
                if done {
                    room = claimer.map(|claimer| Room::Bytes { claimer });
                    let replayable = {
                        let shard = store.shard(&key);
                        let entry = shard.get(&key).expect("just completed");
                        assert_eq!(
                            entry.expires_at,
                            saturating_add(now, retention),
                            "{context}: retention"
                        );
                        match entry.state {
                            State::Completed { .. } => true,
                            State::NotReplayable => false,
                            State::InProgress { .. } => panic!("{context}: still a claim"),
                        }
                    };
                    // Every record holding bytes can be made to pay (its own scope's when
                    // no larger one): a response that fits the shard is always kept.
                    // (Unless it is born at its end: a retention of zero.)
                    if size.is_some_and(|size| size <= store.inner.max_bytes_per_shard)
                        && !retention.is_zero()
                    {
                        assert!(replayable, "{context}: a response that fits was dropped");
                    }
                    model[i] = Model::Done {
                        expires: saturating_add(now, retention),
                        replayable,
                    };
                } else {
                    model[i] = Model::Absent;
                }
            }
            4 => {
                if let Model::Held { token, lease_end } = model[i] {
                    let released = store.do_release(key, token);
                    assert_eq!(released, lease_end > now, "{context}: release");
                    model[i] = Model::Absent;
                }
            }
            5 => {
                if let Model::Held { token, lease_end } = model[i] {
                    let lease = Duration::from_secs([5, 30][rng.below(2)]);
                    let extended = store.do_extend(key, token, lease);
                    assert_eq!(extended, lease_end > now, "{context}: extend");
                    if extended {
                        model[i] = Model::Held {
                            token,
                            lease_end: saturating_add(now, lease),
                        };
                    } else {
                        model[i] = Model::Absent;
                    }
                }
            }
            6 => {
                // A claimer whose lease expired and whose key was taken over is fenced.
                if let Some(&(j, old)) = stale.get(rng.below(stale.len().max(1))) {
                    let key = pool_key(j, scopes);
                    assert!(!store.do_extend(key, old, LEASE), "{context}: stale extend");
                    assert!(
                        !store.do_complete(key, old, response(10), DAY),
                        "{context}: stale complete"
                    );
                    assert!(!store.do_release(key, old), "{context}: stale release");
                }
            }
            _ => {
                // Up to past every retention at once: whole scopes expire unpurged.
                let ms =
                    [0, 500, 1_000, 4_999, 5_000, 10_000, 31_000, 61_000, 301_000][rng.below(9)];
                tokio::time::advance(Duration::from_millis(ms)).await;
            }
        }
        check_evictions(&store, &key, now, &snapshot, room, &context);
        // Every live claim is in the map under its own token: none was evicted.
        let now = Instant::now();
        for (j, m) in model.iter().enumerate() {
            if let Model::Held { token, lease_end } = *m {
                if lease_end > now {
                    let key = pool_key(j, scopes);
                    let shard = store.shard(&key);
                    assert!(
                        matches!(
                            shard.get(&key).map(|e| &e.state),
                            Some(State::InProgress { token: t }) if *t == token
                        ),
                        "{context}: live claim of key {j} is not in the map"
                    );
                }
            }
        }
        check_all(&store, &context);
    }
}

#[tokio::test(start_paused = true)]
async fn random_sequences_keep_every_index_and_count_in_step_with_the_map() {
    for seed in 1..=8u64 {
        for scopes in [3, SCOPES.len()] {
            let seed = seed ^ (scopes as u64) << 40;
            // One shard, bounds hit constantly.
            let small = MemoryStore::builder()
                .max_entries(8)
                .max_bytes(1_000)
                .build();
            random_sequence(
                small,
                seed.wrapping_mul(0x9e37_79b9_7f4a_7c15),
                3_000,
                scopes,
            )
            .await;
            // Room for every key; only the byte bound and expiry act.
            let roomy = MemoryStore::builder()
                .max_entries(64)
                .max_bytes(3_000)
                .build();
            random_sequence(
                roomy,
                seed.wrapping_mul(0x2545_f491_4f6c_dd1d),
                3_000,
                scopes,
            )
            .await;
            // Two shards.
            let sharded = MemoryStore::builder()
                .max_entries(512)
                .max_bytes(2_000)
                .build();
            assert_eq!(sharded.inner.shards.len(), 2);
            let seed = seed.wrapping_mul(0x1234_5678_9abc_def1) | 1;
            random_sequence(sharded, seed, 3_000, scopes).await;
        }
    }
}
