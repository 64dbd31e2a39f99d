//! The crate docs' recommended handler stack (gating breaker → retry → timeout → job): it builds
//! for a `Worker`, and `JobClassifier` reads each outcome through every layer's error: an
//! attempt cut by its timeout is transient (the entry stays pending), a permanent job error is
//! dead-lettered, success is acknowledged. Paused time; the job's calls are counted.

use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;
use tower::{ServiceBuilder, ServiceExt};
use tower_once_breaker::CircuitBreakerLayer;
use tower_once_retry::classify::{Action, Classify};
use tower_once_retry::RetryLayer;
use tower_once_timeout::TimeoutLayer;
use tower_once_worker::classify::JobClassifier;
use tower_once_worker::{Job, JobError, JobId};

fn job(payload: &'static str) -> Job {
    Job::new("1-0", JobId::new("j-1").unwrap(), payload, 1)
}

#[tokio::test(start_paused = true)]
async fn the_recommended_stack_keeps_each_outcomes_permanence() {
    let calls = Arc::new(AtomicU32::new(0));
    let count = calls.clone();
    let handler = ServiceBuilder::new()
        .layer(CircuitBreakerLayer::new().gate_readiness(true))
        .layer(RetryLayer::new().classify(JobClassifier).max_attempts(2))
        .layer(TimeoutLayer::new(Duration::from_millis(100)))
        .service_fn(move |job: Job| {
            count.fetch_add(1, SeqCst);
            async move {
                match &job.payload()[..] {
                    b"slow" => {
                        tokio::time::sleep(Duration::from_secs(5)).await;
                        Ok(())
                    }
                    b"bad" => Err(JobError::permanent("bad payload")),
                    _ => Ok(()),
                }
            }
        });

    let slow = handler.clone().oneshot(job("slow")).await;
    assert!(matches!(
        JobClassifier.classify(&slow),
        Action::Retry { .. }
    ));
    assert_eq!(
        calls.load(SeqCst),
        2,
        "the timeout is retried inside the delivery"
    );

    let bad = handler.clone().oneshot(job("bad")).await;
    assert_eq!(JobClassifier.classify(&bad), Action::Stop);
    assert_eq!(calls.load(SeqCst), 3, "a permanent error is not retried");

    let ok = handler.oneshot(job("ok")).await;
    assert_eq!(JobClassifier.classify(&ok), Action::Success);
}
