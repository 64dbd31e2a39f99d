//! `RunOnceLayer` on the in-memory store under paused time: the lease is renewed while a slow
//! handler runs, a failure releases the claim, a success makes later deliveries duplicates,
//! and the delivery's deadline reaches a handler called after the claim.

use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;
use tower::{Layer, ServiceExt};
use tower_once_idempotency::store::MemoryStore;
use tower_once_timeout::Deadline;
use tower_once_worker::{Job, JobError, JobId, RunOnceLayer};

fn job(id: &str) -> Job {
    Job::new("1-0", JobId::new(id).unwrap(), "{}", 1)
}

#[tokio::test(start_paused = true)]
async fn a_slow_handler_keeps_its_claim_and_later_deliveries_are_duplicates() {
    let calls = Arc::new(AtomicU32::new(0));
    let counter = calls.clone();
    let layer = RunOnceLayer::new(MemoryStore::new()).lease(Duration::from_millis(300));
    let svc = layer.layer(tower::service_fn(move |_job: Job| {
        counter.fetch_add(1, SeqCst);
        async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            Ok::<_, JobError>("sent")
        }
    }));
    let first = tokio::spawn(svc.clone().oneshot(job("mail-1")));
    // Three leases later the first delivery is still running: the renewals kept the claim.
    tokio::time::sleep(Duration::from_millis(900)).await;
    let second = svc.clone().oneshot(job("mail-1")).await.unwrap_err();
    assert!(second.is_in_progress(), "{second}");
    assert_eq!(first.await.unwrap().unwrap().into_response(), Some("sent"));
    assert!(svc
        .clone()
        .oneshot(job("mail-1"))
        .await
        .unwrap()
        .is_duplicate());
    assert_eq!(calls.load(SeqCst), 1, "one effect for three deliveries");
}

#[tokio::test(start_paused = true)]
async fn a_failure_releases_the_claim_so_the_next_delivery_runs() {
    let calls = Arc::new(AtomicU32::new(0));
    let counter = calls.clone();
    let svc = RunOnceLayer::new(MemoryStore::new()).layer(tower::service_fn(move |_job: Job| {
        let n = counter.fetch_add(1, SeqCst);
        async move {
            if n == 0 {
                Err(JobError::transient("smtp down"))
            } else {
                Ok(())
            }
        }
    }));
    let err = svc.clone().oneshot(job("mail-2")).await.unwrap_err();
    assert!(err.is_inner() && err.get_inner().unwrap().is_transient());
    assert!(!svc
        .clone()
        .oneshot(job("mail-2"))
        .await
        .unwrap()
        .is_duplicate());
    assert!(svc
        .clone()
        .oneshot(job("mail-2"))
        .await
        .unwrap()
        .is_duplicate());
    assert_eq!(calls.load(SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn the_delivery_deadline_reaches_a_handler_called_after_the_claim() {
    let deadline = Deadline::after(Duration::from_secs(5));
    let svc = RunOnceLayer::new(MemoryStore::new()).layer(tower::service_fn(|_job: Job| {
        let seen = Deadline::current();
        async move { Ok::<_, JobError>(seen) }
    }));
    let outcome = svc
        .oneshot(job("mail-3").with_deadline(deadline))
        .await
        .unwrap();
    assert_eq!(outcome.into_response(), Some(Some(deadline)));
}

/// A job carries its delivery's deadline and a retry attempt's mark (it is a `Carrier`): a
/// handler stack behind a `Buffer`, called from another task, ends at the deadline, and an inner
/// retry layer defers to the outer one instead of multiplying attempts.
#[tokio::test(start_paused = true)]
async fn a_jobs_deadline_and_attempt_mark_cross_a_buffer_and_a_task() {
    use tower_once_retry::RetryLayer;
    use tower_once_timeout::TimeoutLayer;

    // The deadline: a hanging handler behind a Buffer, on another task, ends at it.
    let calls = Arc::new(AtomicU32::new(0));
    let counter = calls.clone();
    let hanging = tower::service_fn(move |_job: Job| {
        counter.fetch_add(1, SeqCst);
        std::future::pending::<Result<(), JobError>>()
    });
    let stack = RetryLayer::new()
        .no_budget()
        .layer(TimeoutLayer::new(Duration::from_secs(30)).layer(hanging));
    let buffered = tower::buffer::Buffer::new(stack, 4);
    let started = tokio::time::Instant::now();
    let delivery = job("deadline-1").with_deadline(Deadline::after(Duration::from_secs(2)));
    let outcome = tokio::spawn(buffered.oneshot(delivery)).await.unwrap();
    assert!(outcome.is_err());
    assert_eq!(calls.load(SeqCst), 1, "no retry after the deadline");
    assert_eq!(started.elapsed(), Duration::from_secs(2));

    // The mark: an inner retry on another task makes one attempt per outer attempt.
    let calls = Arc::new(AtomicU32::new(0));
    let counter = calls.clone();
    let failing = tower::service_fn(move |_job: Job| {
        counter.fetch_add(1, SeqCst);
        async { Err::<(), _>(JobError::transient("busy")) }
    });
    let inner = RetryLayer::new().no_budget().layer(failing);
    let spawning = tower::service_fn(move |job: Job| {
        let inner = inner.clone();
        async move { tokio::spawn(inner.oneshot(job)).await.unwrap() }
    });
    let outer = RetryLayer::new()
        .no_budget()
        .max_attempts(3)
        .layer(spawning);
    let err = outer.oneshot(job("nested-1")).await.unwrap_err();
    assert_eq!(err.attempts(), 3);
    assert_eq!(calls.load(SeqCst), 3, "3 attempts, not 3 x 4");
}
