//! `RunOnceLayer`'s builder asks nothing of the store (code generic over it compiles), and
//! `new` is a `const fn`. Its service asks what the worker asks of a handler anyway: `Send`
//! and `'static` (its future is boxed and `Send`, as a step's is), so a handler with a `!Send`
//! future runs under neither.

use std::time::Duration;
use tower::{Layer, ServiceExt};
use tower_once_idempotency::store::MemoryStore;
use tower_once_worker::{Job, JobError, JobId, RunOnceLayer, RunOnceOutcome};

/// Generic over the store, as a library wrapping the worker would be.
fn with_lease<St>(layer: RunOnceLayer<St>) -> RunOnceLayer<St> {
    layer
        .lease(Duration::from_secs(10))
        .retention(Duration::from_secs(60))
}

const fn layer_of<St>(store: St) -> RunOnceLayer<St> {
    RunOnceLayer::new(store)
}

#[tokio::test(flavor = "current_thread")]
async fn the_builder_is_generic_over_the_store_and_new_is_const() {
    let handler = tower::service_fn(|_job: Job| async { Ok::<_, JobError>("sent") });
    let run_once = with_lease(layer_of(MemoryStore::new())).layer(handler);
    let job = Job::new("1-0", JobId::new("local-1").unwrap(), "{}", 1);
    let first = run_once.clone().oneshot(job.clone()).await.unwrap();
    assert_eq!(first, RunOnceOutcome::Done("sent"));
    assert!(run_once.oneshot(job).await.unwrap().is_duplicate());
}
