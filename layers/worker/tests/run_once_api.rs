//! FAILS TO COMPILE on 192d08c (compiled and passed before it). The commit says worker code is
//! unchanged, but the re-exported `RunOnce` now needs what the step mechanism's boxed `Send`
//! future needs: `S: Send + 'static`, `S::Future: Send`, `S::Response`/`S::Error: Send +
//! 'static`, `Job: Send`; and `RunOnceLayer::lease`/`retention` now need `St: Clone`. The old
//! `RunOnce` asked only `S: Service<Job> + Clone`: a handler with a `!Send` future (an `Rc`, a
//! `RefCell` borrow across an await) on a `LocalSet`, or code generic over the store, no longer
//! compiles. (`RunOnceLayer::new` is no longer a `const fn`, and `run_once::ResponseFuture`'s
//! type parameters changed from `<S, St>` to `<R, E>`, too.)

use std::rc::Rc;
use std::time::Duration;
use tower::{Layer, ServiceExt};
use tower_once_idempotency::store::MemoryStore;
use tower_once_worker::{Job, JobError, JobId, RunOnceLayer, RunOnceOutcome};

/// Generic over the store, as a library wrapping the worker would be.
fn with_lease<St>(layer: RunOnceLayer<St>) -> RunOnceLayer<St> {
    layer.lease(Duration::from_secs(10))
}

#[tokio::test(flavor = "current_thread")]
async fn a_handler_with_a_non_send_future_runs_once_on_a_local_set() {
    let local = tokio::task::LocalSet::new();
    local
        .run_until(async {
            let handler = tower::service_fn(|_job: Job| {
                let local_only = Rc::new("sent");
                async move { Ok::<_, JobError>(*local_only) }
            });
            let run_once = with_lease(RunOnceLayer::new(MemoryStore::new())).layer(handler);
            let job = Job::new("1-0", JobId::new("local-1").unwrap(), "{}", 1);
            let first = run_once.clone().oneshot(job.clone()).await.unwrap();
            assert_eq!(first, RunOnceOutcome::Done("sent"));
            assert!(run_once.oneshot(job).await.unwrap().is_duplicate());
        })
        .await;
}
