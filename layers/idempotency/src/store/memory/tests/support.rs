//! What the memory store's tests share: keys, responses, claims, a one-shard store with exact
//! bounds, the invariant check, a count of the scopes an operation visits, and a small
//! deterministic random generator.

use super::super::entry::State;
use super::super::rank;
use super::super::shard::Shard;
use super::super::{lock, Inner, MemoryStore};
use crate::fingerprint::Fingerprint;
use crate::store::{
    ClaimOutcome, ClaimToken, Completion, ExistingRecord, RecordState, StoreKey, StoredResponse,
};
use http::StatusCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

pub(super) fn key(n: u8) -> StoreKey {
    StoreKey::from_bytes([n; 32])
}

pub(super) const FP: Fingerprint = Fingerprint::from_bytes([9; 32]);

pub(super) const LEASE: Duration = Duration::from_secs(10);

pub(super) const DAY: Duration = Duration::from_secs(86_400);

pub(super) fn response(len: usize) -> Completion {
    Completion::Response(StoredResponse::new(
        StatusCode::OK,
        Default::default(),
        vec![b'x'; len].into(),
    ))
}

pub(super) fn claimed(store: &MemoryStore, key: StoreKey) -> ClaimToken {
    let token = ClaimToken::new();
    assert!(matches!(
        store.do_claim(key, token, FP, LEASE),
        Ok(ClaimOutcome::Claimed)
    ));
    token
}

pub(super) fn is_completed(store: &MemoryStore, key: StoreKey) -> bool {
    matches!(
        store.do_claim(key, ClaimToken::new(), FP, LEASE),
        Ok(ClaimOutcome::Existing(ExistingRecord {
            state: RecordState::Completed(_),
            ..
        }))
    )
}

pub(super) fn scoped(n: u32, scope: &[u8]) -> StoreKey {
    let mut bytes = [0; 32];
    bytes[..4].copy_from_slice(&n.to_le_bytes());
    bytes[4..4 + scope.len().min(28)].copy_from_slice(&scope[..scope.len().min(28)]);
    StoreKey::from_bytes(bytes).with_scope(scope)
}

pub(super) fn done(store: &MemoryStore, key: StoreKey, len: usize, retention: Duration) {
    let t = claimed(store, key);
    assert!(store.do_complete(key, t, response(len), retention));
}

/// What `key` answers, without claiming it: "absent", "claim", "completed", "not-replayable".
pub(super) fn peek(store: &MemoryStore, key: StoreKey) -> &'static str {
    let shard = lock(&store.inner.shards[0]);
    match shard.get(&key).map(|e| (&e.state, e.expires_at)) {
        None => "absent",
        Some((_, end)) if end <= Instant::now() => "absent",
        Some((State::InProgress { .. }, _)) => "claim",
        Some((State::Completed { .. }, _)) => "completed",
        Some((State::NotReplayable, _)) => "not-replayable",
    }
}

/// A store of one shard with exactly these bounds (the builder splits stores of 512 entries
/// or more over several shards).
pub(super) fn one_shard(max_entries: usize, max_bytes: usize) -> MemoryStore {
    MemoryStore {
        inner: Arc::new(Inner {
            shards: vec![Mutex::new(Shard::default())].into_boxed_slice(),
            max_entries_per_shard: max_entries,
            max_bytes_per_shard: max_bytes,
        }),
    }
}

pub(super) fn check_all(store: &MemoryStore, context: &str) {
    for shard in store.inner.shards.iter() {
        lock(shard).check_invariants(
            store.inner.max_entries_per_shard,
            store.inner.max_bytes_per_shard,
            context,
        );
    }
}

/// The scopes `op` visits one by one (see `rank::SCOPE_VISITS`).
pub(super) fn visits_of<T>(op: impl FnOnce() -> T) -> (T, usize) {
    let before = rank::SCOPE_VISITS.with(std::cell::Cell::get);
    let out = op();
    (out, rank::SCOPE_VISITS.with(std::cell::Cell::get) - before)
}

/// A small deterministic xorshift generator: random sequences without a new dependency.
pub(super) struct XorShift(pub(super) u64);

impl XorShift {
    pub(super) fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub(super) fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// The scopes of the random sequences' keys: the empty scope (tag 0) among them.
pub(super) const SCOPES: [&[u8]; 7] = [b"a", b"b", b"c", b"", b"d", b"e", b"f"];

/// Keys in pairs that differ only in their last 16 bytes (one hash, two records), over
/// `scopes` scopes and (with several shards) more than one shard.
pub(super) fn pool_key(i: usize, scopes: usize) -> StoreKey {
    let mut bytes = [0xab; 32];
    bytes[0] = (i / 2) as u8;
    bytes[16..].fill(0x10 + (i % 2) as u8);
    StoreKey::from_bytes(bytes).with_scope(SCOPES[i % scopes])
}
