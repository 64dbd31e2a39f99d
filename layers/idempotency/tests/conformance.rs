//! The store contract (the `store` module's numbered rules, checked by the public conformance
//! suite) against `MemoryStore`, on tokio's paused clock.

use tower_once_idempotency::store::conformance::{PausedClock, Suite};
use tower_once_idempotency::store::MemoryStore;

#[tokio::test(start_paused = true)]
async fn memory_store_keeps_the_contract() {
    Suite::new(MemoryStore::new(), PausedClock).run().await;
}

#[tokio::test(start_paused = true)]
async fn single_shard_memory_store_keeps_the_contract() {
    let store = MemoryStore::builder().max_entries(200).build();
    Suite::new(store, PausedClock).run().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_race_on_real_threads() {
    let suite = Suite::new(MemoryStore::new(), PausedClock).concurrency(256);
    for _ in 0..20 {
        suite.concurrent_claims_have_one_winner().await;
    }
}
