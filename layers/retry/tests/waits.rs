//! Waits between attempts, inside one deadline (retry crate docs: every
//! attempt and wait inside one deadline, never sleeping when the wait would end past it; crate docs
//! "Semantics": no wait continues once it has passed; `Retry-After` honoured, capped): whatever mix
//! of slow, instant and hanging attempts, waits, `Retry-After` values, services that stop being
//! ready and outer deadlines, the operation ends exactly at its deadline, never later. Time
//! assertions use tokio's paused clock only.

mod support;

use http::StatusCode;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use support::{fixed, get, http_upstream};
use tokio::time::Instant;
use tower::{Layer, Service, ServiceBuilder, ServiceExt};
use tower_once_retry::classify::HttpClassifier;
use tower_once_retry::{GiveUp, RetryLayer};
use tower_once_timeout::Deadline;

type BoxFut<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// What attempt `n` (from 0) does.
#[derive(Clone, Copy)]
enum Step {
    /// Fails at once.
    Fail,
    /// Fails after this long.
    FailAfter(u64),
    /// Never answers.
    Hang,
}

/// A service that plays `script` (the last step repeats), recording when each call came.
#[derive(Clone)]
struct Scripted {
    script: Arc<Vec<Step>>,
    calls: Arc<Mutex<Vec<Instant>>>,
    /// After this many calls, `poll_ready` is pending forever (and never wakes anyone).
    ready_for: usize,
}

impl Scripted {
    fn new(script: &[Step]) -> Self {
        Self {
            script: Arc::new(script.to_vec()),
            calls: Arc::default(),
            ready_for: usize::MAX,
        }
    }
    fn calls(&self) -> usize {
        self.calls.lock().unwrap().len()
    }
}

impl Service<u32> for Scripted {
    type Response = ();
    type Error = &'static str;
    type Future = BoxFut<Result<(), &'static str>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        if self.calls() >= self.ready_for {
            Poll::Pending
        } else {
            Poll::Ready(Ok(()))
        }
    }

    fn call(&mut self, _: u32) -> Self::Future {
        let n = {
            let mut calls = self.calls.lock().unwrap();
            calls.push(Instant::now());
            calls.len() - 1
        };
        let step = self.script[n.min(self.script.len() - 1)];
        Box::pin(async move {
            match step {
                Step::Fail => Err("failed"),
                Step::FailAfter(ms) => {
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                    Err("failed")
                }
                Step::Hang => std::future::pending().await,
            }
        })
    }
}

/// Several waits, the timer alternately armed by a pending attempt and by a wait, then a hang:
/// the operation ends exactly at its deadline, never later.
#[tokio::test(start_paused = true)]
async fn one_deadline_over_several_waits_slow_and_instant_failures_then_a_hang() {
    let scripts: [&[Step]; 4] = [
        &[Step::Fail, Step::Fail, Step::Fail, Step::Hang],
        &[
            Step::FailAfter(300),
            Step::FailAfter(300),
            Step::FailAfter(300),
            Step::Hang,
        ],
        &[
            Step::Fail,
            Step::FailAfter(300),
            Step::Fail,
            Step::FailAfter(50),
            Step::Hang,
        ],
        &[Step::FailAfter(300), Step::Fail, Step::Fail, Step::Hang],
    ];
    for (i, script) in scripts.into_iter().enumerate() {
        let upstream = Scripted::new(script);
        let svc = RetryLayer::new()
            .no_budget()
            .max_attempts(10)
            .backoff(fixed(100))
            .deadline(Duration::from_secs(2))
            .layer(upstream.clone());
        let started = Instant::now();
        let err = svc.oneshot(1).await.unwrap_err();
        assert_eq!(
            started.elapsed(),
            Duration::from_secs(2),
            "script {i}: exactly the deadline"
        );
        assert!(err.is_deadline(), "script {i}: {err}");
        assert_eq!(upstream.calls(), script.len(), "script {i}");
    }
}

/// After a wait, the service stops being ready (and never wakes the task): the deadline, not
/// the service, ends the operation.
#[tokio::test(start_paused = true)]
async fn a_service_that_stops_being_ready_after_a_wait_is_cut_at_the_deadline() {
    for first in [Step::Fail, Step::FailAfter(700)] {
        let mut upstream = Scripted::new(&[first]);
        upstream.ready_for = 1;
        let svc = RetryLayer::new()
            .no_budget()
            .backoff(fixed(100))
            .deadline(Duration::from_secs(3))
            .layer(upstream.clone());
        let started = Instant::now();
        let err = svc.oneshot(1).await.unwrap_err();
        assert_eq!(started.elapsed(), Duration::from_secs(3));
        assert_eq!(err.reason(), GiveUp::Deadline, "{err}");
        assert_eq!(upstream.calls(), 1);
    }
}

/// The server's Retry-After sets the wait; the attempts after it hang: the HTTP form still ends
/// at the deadline, whether the 503 came at once or after a pending poll armed the timer.
#[tokio::test(start_paused = true)]
async fn http_form_retry_after_then_a_hang_ends_at_the_deadline() {
    static SCRIPT: [(u16, Option<&str>); 3] = [(503, Some("1")), (429, Some("2")), (0, None)];
    let calls = Arc::new(AtomicUsize::new(0));
    let layer = RetryLayer::new()
        .classify(HttpClassifier)
        .no_budget()
        .max_attempts(10)
        .deadline(Duration::from_secs(10))
        .into_http();
    let svc = layer.layer(http_upstream(&SCRIPT, calls.clone()));
    let started = Instant::now();
    let err = svc.oneshot(get()).await.unwrap_err();
    assert_eq!(started.elapsed(), Duration::from_secs(10));
    assert!(err.is_deadline(), "{err}");
    assert_eq!(
        calls.load(SeqCst),
        3,
        "two waits of 1 s and 2 s, then the hang"
    );
    let stats = layer.stats();
    assert_eq!(
        (
            stats.operations,
            stats.attempts,
            stats.retries,
            stats.give_ups
        ),
        (1, 3, 2, 1),
        "{stats:?}"
    );
}

/// A Retry-After that would end past the deadline is not waited for (the HTTP form too), and a
/// capped one is waited exactly.
#[tokio::test(start_paused = true)]
async fn http_form_retry_after_past_the_deadline_gives_up_at_once() {
    static SCRIPT: [(u16, Option<&str>); 2] = [(503, Some("3600")), (200, None)];
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = http_layer(Duration::from_secs(30), Duration::from_secs(7200))
        .layer(http_upstream(&SCRIPT, calls.clone()));
    let started = Instant::now();
    let res = svc.oneshot(get()).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(started.elapsed(), Duration::ZERO);
    assert_eq!(calls.load(SeqCst), 1);

    let calls = Arc::new(AtomicUsize::new(0));
    let svc = http_layer(Duration::from_secs(30), Duration::from_secs(5))
        .layer(http_upstream(&SCRIPT, calls.clone()));
    let started = Instant::now();
    let res = svc.oneshot(get()).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(5)
            && waited < Duration::from_secs(5) + Duration::from_millis(2),
        "capped Retry-After: {waited:?}"
    );
}

fn http_layer(
    deadline: Duration,
    cap: Duration,
) -> tower_once_retry::http::HttpRetryLayer<HttpClassifier> {
    RetryLayer::new()
        .classify(HttpClassifier)
        .no_budget()
        .deadline(deadline)
        .retry_after_cap(cap)
        .into_http()
}

/// A Retry-After of ten years under a `Duration::MAX` deadline and cap: the one timer is reset
/// to an instant ten years out, then back to the (saturated) deadline; no panic, one retry.
#[tokio::test(start_paused = true)]
async fn a_retry_after_of_ten_years_is_waited_without_a_panic() {
    static SCRIPT: [(u16, Option<&str>); 2] = [(503, Some("315360000")), (200, None)];
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = RetryLayer::new()
        .classify(HttpClassifier)
        .no_budget()
        .deadline(Duration::MAX)
        .retry_after_cap(Duration::MAX)
        .into_http()
        .layer(http_upstream(&SCRIPT, calls.clone()));
    let started = Instant::now();
    let res = svc.oneshot(get()).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(calls.load(SeqCst), 2);
    assert!(started.elapsed() >= Duration::from_secs(315_360_000));
}

/// A deadline already in scope when the call is made (a caller's, or an outer layer's) and
/// sooner than the layer's own bounds every attempt and wait, even though the future is polled
/// outside that scope.
#[tokio::test(start_paused = true)]
async fn an_outer_deadline_in_scope_bounds_waits_and_attempts() {
    let upstream = Scripted::new(&[Step::Fail, Step::FailAfter(200), Step::Hang]);
    let mut svc = RetryLayer::new()
        .no_budget()
        .max_attempts(10)
        .backoff(fixed(100))
        .deadline(Duration::from_secs(30))
        .layer(upstream.clone());
    let started = Instant::now();
    let outer = Deadline::after(Duration::from_millis(1_500));
    let future = outer.scope(|| svc.call(1));
    let err = future.await.unwrap_err();
    assert_eq!(started.elapsed(), Duration::from_millis(1_500));
    assert!(err.is_deadline(), "{err}");
    assert_eq!(upstream.calls(), 3);
}

/// Two retry layers stacked: the inner defers (one attempt each), the outer's deadline ends the
/// operation after its waits, at exactly its deadline.
#[tokio::test(start_paused = true)]
async fn nested_layers_end_at_the_outer_deadline_after_waits() {
    let upstream = Scripted::new(&[Step::Fail, Step::Fail, Step::Hang]);
    let svc = ServiceBuilder::new()
        .layer(
            RetryLayer::new()
                .no_budget()
                .backoff(fixed(100))
                .deadline(Duration::from_secs(2)),
        )
        .layer(
            RetryLayer::new()
                .no_budget()
                .backoff(fixed(100))
                .deadline(Duration::from_secs(60)),
        )
        .service(upstream.clone());
    let started = Instant::now();
    let err = svc.oneshot(1).await.unwrap_err();
    assert_eq!(started.elapsed(), Duration::from_secs(2));
    assert!(err.is_deadline(), "{err}");
    assert_eq!(
        upstream.calls(),
        3,
        "no multiplication: the outer layer retries"
    );
}

/// The layer keeps one timer for the deadline and the waits between attempts: after a wait, it
/// must guard the deadline again, whether the timer was first armed by a pending attempt or by
/// the wait.
#[tokio::test(start_paused = true)]
async fn the_deadline_still_ends_a_hanging_attempt_after_a_wait() {
    for first_pends in [false, true] {
        let calls = Arc::new(AtomicUsize::new(0));
        let counted = calls.clone();
        let svc = tower::service_fn(move |_req: u32| {
            let call = counted.fetch_add(1, SeqCst);
            async move {
                match call {
                    0 if first_pends => {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        Err("failed")
                    }
                    0 => Err("failed"),
                    _ => std::future::pending::<Result<(), &str>>().await,
                }
            }
        });
        let svc = RetryLayer::new()
            .no_budget()
            .rng_seed(7)
            .deadline(Duration::from_secs(5))
            .layer(svc);
        let started = tokio::time::Instant::now();
        let err = svc.oneshot(1).await.unwrap_err();
        assert!(err.is_deadline(), "{err}");
        assert_eq!(calls.load(SeqCst), 2, "one retry after the wait");
        assert_eq!(
            started.elapsed(),
            Duration::from_secs(5),
            "paused clock: exactly the deadline (first attempt pending: {first_pends})"
        );
    }
}
