//! The memory store alone: what a new key costs (claim, then complete with a small response)
//! in a full store (every new key makes room) of 100 000 records spread over 1 to 100 000
//! scopes (tenants; at 100 000, one record each, as with a scope per user). A store full of
//! many tenants must cost a new key about what a store full of one tenant does.
//!
//! ```sh
//! cargo bench --bench memory_store
//! ```

#![allow(missing_docs)] // criterion_group! generates an undocumented pub fn

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use http::StatusCode;
use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;
use tower_once::idempotency::fingerprint::Fingerprint;
use tower_once::idempotency::store::{
    ClaimToken, Completion, IdempotencyStore, MemoryStore, StoreKey, StoredResponse,
};

const RECORDS: u64 = 100_000;
const LEASE: Duration = Duration::from_secs(10);
const RETENTION: Duration = Duration::from_secs(86_400);

/// The memory store answers at once: its futures are ready on their first poll.
fn now<F: Future>(future: F) -> F::Output {
    match pin!(future).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(output) => output,
        Poll::Pending => unreachable!("the memory store answers at once"),
    }
}

fn key(n: u64, scopes: u64) -> StoreKey {
    let mut bytes = [0; 32];
    bytes[..8].copy_from_slice(&n.wrapping_mul(0x9E37_79B9_7F4A_7C15).to_le_bytes());
    bytes[8..16].copy_from_slice(&n.to_le_bytes());
    StoreKey::from_bytes(bytes).with_scope(&(n % scopes).to_le_bytes())
}

/// Claims `key` and completes it with a small response, as a fresh request does.
fn new_key(store: &MemoryStore, key: StoreKey) {
    let token = ClaimToken::new();
    let fingerprint = Fingerprint::from_bytes([1; 32]);
    now(store.claim(key, token, fingerprint, LEASE)).expect("room is made");
    let response = StoredResponse::new(
        StatusCode::CREATED,
        Default::default(),
        Bytes::from_static(b"{\"id\":\"ch_1\"}"),
    );
    now(store.complete(key, token, Completion::Response(response), RETENTION))
        .expect("the memory store never fails");
}

fn bench(c: &mut Criterion) {
    // Tokio's clock: the store reads it (a runtime is entered, not driven).
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a runtime");
    let _entered = rt.enter();
    let mut group = c.benchmark_group("memory_store");
    group.measurement_time(Duration::from_secs(3));
    for scopes in [1, 100, 10_000, RECORDS] {
        let store = MemoryStore::builder().max_entries(RECORDS as usize).build();
        for n in 0..RECORDS {
            new_key(&store, key(n, scopes));
        }
        let mut n = RECORDS;
        group.bench_function(BenchmarkId::new("new_key/full", scopes), |b| {
            b.iter(|| {
                n += 1;
                new_key(&store, key(n, scopes));
            });
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
