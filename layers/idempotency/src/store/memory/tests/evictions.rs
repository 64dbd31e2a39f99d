//! What one operation may evict, by the `MemoryStore` docs (checked after every step of the
//! random sequences, `model.rs`): a live record goes only when room was made, after every
//! expired record went; for bytes only a record holding bytes, and it keeps its key; and only
//! from the claimer's own scope or one that held strictly more than the claimer.

use super::super::entry::State;
use super::super::MemoryStore;
use crate::store::StoreKey;
use tokio::time::Instant;

/// What the shard of a key held before an operation: its live completed records (key,
/// scope, replayable) and what each scope held (entries, bytes).
pub(super) struct Before {
    pub(super) live: Vec<(StoreKey, u64, bool)>,
    pub(super) held: std::collections::HashMap<u64, (usize, usize)>,
}

pub(super) fn before(store: &MemoryStore, key: &StoreKey, now: Instant) -> Before {
    let shard = store.shard(key);
    let live = shard
        .records()
        .filter(|(_, e)| e.expires_at > now && !matches!(e.state, State::InProgress { .. }))
        .map(|(k, e)| (*k, e.scope, matches!(e.state, State::Completed { .. })))
        .collect();
    let held = shard.holdings().collect();
    Before { live, held }
}

/// Who made room in an operation: a fresh claim (room by entries) or a completion (room by
/// bytes), of `key` whose record is in scope `claimer`.
#[derive(Clone, Copy)]
pub(super) enum Room {
    Entries { claimer: u64 },
    Bytes { claimer: u64 },
}

/// Checks what an operation on `key` evicted against the share: a live record goes only
/// when room was made, after every expired record went; for bytes only a record holding
/// bytes; and only from the claimer's own scope or one that held strictly more than the
/// claimer was left holding before its new record (what the claimer held when the victim
/// was chosen is at least that, and the victim held at most what it held before).
pub(super) fn check_evictions(
    store: &MemoryStore,
    key: &StoreKey,
    now: Instant,
    before: &Before,
    room: Option<Room>,
    context: &str,
) {
    let shard = store.shard(key);
    let gone: Vec<_> = before
        .live
        .iter()
        .filter(|(k, ..)| shard.get(k).is_none())
        .collect();
    // Records that held a response and now hold none: what room for bytes takes.
    let demoted: Vec<_> = before
        .live
        .iter()
        .filter(|(k, _, replayable)| {
            *replayable
                && *k != *key
                && shard
                    .get(k)
                    .is_some_and(|e| matches!(e.state, State::NotReplayable))
        })
        .collect();
    if let (Some(Room::Bytes { .. }), false) = (room, gone.is_empty()) {
        panic!("{context}: records {gone:?} forgotten to make room for bytes");
    }
    if !demoted.is_empty() && !matches!(room, Some(Room::Bytes { .. })) {
        panic!("{context}: responses of {demoted:?} dropped without room for bytes");
    }
    let gone: Vec<_> = gone.into_iter().chain(demoted).collect();
    if gone.is_empty() {
        return;
    }
    let Some(room) = room else {
        panic!("{context}: live records {gone:?} dropped by an operation that made no room");
    };
    let held_by = |scope| {
        shard
            .held(scope)
            .expect("the claimer's scope holds its record")
    };
    let record = |key| shard.get(key).expect("the operation's record");
    // (The operation's own record may be born expired: a retention of zero.)
    for (k, e) in shard.records().filter(|(k, _)| *k != key) {
        assert!(
            matches!(e.state, State::InProgress { .. }) || e.expires_at > now,
            "{context}: live records {gone:?} paid while {k:?} was past its retention"
        );
    }
    let (claimer, own) = match room {
        Room::Entries { claimer } => (claimer, held_by(claimer).0 - 1),
        Room::Bytes { claimer } => (claimer, held_by(claimer).1 - record(key).state.size()),
    };
    for (k, scope, replayable) in gone {
        if let Room::Bytes { .. } = room {
            assert!(replayable, "{context}: zero-byte {k:?} evicted for bytes");
        }
        if *scope == claimer {
            continue;
        }
        let (entries, bytes) = before.held[scope];
        let held = match room {
            Room::Entries { .. } => entries,
            Room::Bytes { .. } => bytes,
        };
        assert!(
            held > own,
            "{context}: {k:?} of a scope holding {held} paid for a claimer left holding {own}"
        );
    }
}
