//! Attacks on the per-thread copies of the layer's config (`shard::PerThread`) and on the one
//! timer a response future keeps for both its deadline and its waits.
//!
//! Time assertions use tokio's paused clock only. The multi-thread tests assert counts, never
//! durations.

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::Instant;
use tower::{Layer, Service, ServiceBuilder, ServiceExt};
use tower_once_retry::backoff::{Backoff, Jitter};
use tower_once_retry::budget::RetryBudget;
use tower_once_retry::classify::HttpClassifier;
use tower_once_retry::hook::RetryEvent;
use tower_once_retry::{GiveUp, RetryLayer};
use tower_once_timeout::Deadline;

mod support;

type BoxFut<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// A fixed 100 ms wait between attempts, no jitter.
fn fixed(ms: u64) -> Backoff {
    Backoff::new(Duration::from_millis(ms), 1.0, Duration::from_millis(ms))
        .unwrap()
        .jitter(Jitter::None)
}

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

/// An HTTP upstream: each call answers the next `(status, Retry-After)` (the last repeats);
/// status 0 hangs.
fn http_upstream<B: Send + 'static>(
    script: &'static [(u16, Option<&'static str>)],
    calls: Arc<AtomicUsize>,
) -> impl Service<Request<B>, Response = Response<Full<Bytes>>, Error = Infallible, Future = impl Send>
       + Clone
       + Send
       + 'static {
    tower::service_fn(move |_req: Request<B>| {
        let n = calls.fetch_add(1, SeqCst);
        let (status, after) = script[n.min(script.len() - 1)];
        async move {
            if status == 0 {
                std::future::pending::<()>().await;
            }
            let mut res = Response::new(Full::new(Bytes::new()));
            *res.status_mut() = StatusCode::from_u16(status).unwrap();
            if let Some(after) = after {
                res.headers_mut()
                    .insert("retry-after", after.parse().unwrap());
            }
            Ok::<_, Infallible>(res)
        }
    })
}

fn get() -> Request<Full<Bytes>> {
    Request::get("/x").body(Full::new(Bytes::new())).unwrap()
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

fn failing(
) -> impl Service<u32, Response = (), Error = &'static str, Future = impl Send> + Clone + Send + 'static
{
    tower::service_fn(|_req: u32| async { Err::<(), _>("down") })
}

/// A budget that allows no retry at all, on a multi-thread runtime with more workers than
/// there are copies of the config, plus `spawn_blocking` threads: every count is exact.
#[test]
fn a_zero_budget_refuses_every_retry_on_every_thread() {
    let layer = RetryLayer::new()
        .max_attempts(3)
        .backoff(fixed(1))
        .budget(RetryBudget::new(0.0, 0, Duration::from_secs(60)));
    let svc = layer.layer(failing());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(12)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut tasks = Vec::new();
        for _ in 0..48 {
            let svc = svc.clone();
            tasks.push(tokio::spawn(async move {
                for _ in 0..10 {
                    let _ = svc.clone().oneshot(1).await;
                }
            }));
        }
        for _ in 0..16 {
            let svc = svc.clone();
            let handle = tokio::runtime::Handle::current();
            tasks.push(tokio::task::spawn_blocking(move || {
                for _ in 0..10 {
                    let _ = handle.block_on(svc.clone().oneshot(1));
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    });
    let s = layer.stats();
    assert_eq!(
        (
            s.operations,
            s.attempts,
            s.retries,
            s.budget_refusals,
            s.give_ups
        ),
        (640, 640, 0, 640, 640),
        "{s:?}"
    );
}

/// A budget with a floor of 10 retries per window and no ratio, shared by services made by two
/// `layer()` calls and used from 16 runtimes on 16 threads (twice the copies): about 10 retries
/// in all (the budget's documented edge races allow a few more), not 10 per copy. The hook,
/// cloned per thread slot, still sees every retry.
#[test]
fn a_budget_floor_is_shared_by_every_copy_and_every_runtime() {
    let hooked = Arc::new(AtomicU64::new(0));
    let counted = hooked.clone();
    let layer = RetryLayer::new()
        .max_attempts(2)
        .backoff(fixed(1))
        .budget(RetryBudget::new(0.0, 1, Duration::from_secs(10)))
        .on_retry(move |_: &RetryEvent<'_, (), &'static str>| {
            counted.fetch_add(1, SeqCst);
        });
    let (a, b) = (layer.layer(failing()), layer.layer(failing()));
    support::calls_on_threads(16, 20, |i| if i % 2 == 0 { a.clone() } else { b.clone() });
    let s = layer.stats();
    assert_eq!(s.operations, 320, "{s:?}");
    assert!(
        (10..=16).contains(&s.retries),
        "one floor of 10 for every copy: {s:?}"
    );
    assert_eq!(s.retries + s.budget_refusals, 320, "{s:?}");
    assert_eq!(s.attempts, 320 + s.retries, "{s:?}");
    assert_eq!(hooked.load(SeqCst), s.retries, "the hook saw every retry");
}

/// The HTTP form's stats are shared by every thread's copy too.
#[test]
fn http_form_stats_are_shared_by_every_thread() {
    static SCRIPT: [(u16, Option<&str>); 1] = [(503, None)];
    let calls = Arc::new(AtomicUsize::new(0));
    let layer = RetryLayer::new()
        .classify(HttpClassifier)
        .max_attempts(2)
        .backoff(fixed(1))
        .no_budget()
        .into_http();
    let svc = layer.layer(http_upstream(&SCRIPT, calls.clone()));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(10)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let tasks: Vec<_> = (0..40)
            .map(|_| {
                let svc = svc.clone();
                tokio::spawn(async move {
                    for _ in 0..5 {
                        let res = svc.clone().oneshot(get()).await.unwrap();
                        assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
    });
    let s = layer.stats();
    assert_eq!(
        (s.operations, s.attempts, s.retries, s.give_ups),
        (200, 400, 200, 200),
        "{s:?}"
    );
    assert_eq!(calls.load(SeqCst), 400);
}

/// `rng_seed` makes delays reproducible: the same 20 operations run one after another give the
/// same delays whether they all run on one thread or each on a thread of its own (so reaching
/// every copy of the config): the copies share one seeded generator.
#[test]
fn a_seed_gives_the_same_delays_whichever_threads_run_the_operations() {
    let run = |own_threads: bool| {
        let delays = Arc::new(Mutex::new(Vec::new()));
        let log = delays.clone();
        let layer = RetryLayer::new()
            .no_budget()
            .max_attempts(4)
            .backoff(Backoff::new(Duration::from_millis(100), 2.0, Duration::from_secs(5)).unwrap())
            .deadline(Duration::from_secs(3600))
            .rng_seed(42)
            .on_retry(move |e: &RetryEvent<'_, (), &'static str>| {
                log.lock().unwrap().push(e.delay);
            });
        let svc = layer.layer(failing());
        let one = |svc: tower_once_retry::Retry<_, _, _>| {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .start_paused(true)
                .build()
                .unwrap();
            rt.block_on(async move {
                let _ = svc.oneshot(1).await;
            });
        };
        for _ in 0..20 {
            let svc = svc.clone();
            if own_threads {
                std::thread::spawn(move || one(svc)).join().unwrap();
            } else {
                one(svc);
            }
        }
        let delays = delays.lock().unwrap().clone();
        delays
    };
    let (here, spread) = (run(false), run(true));
    assert_eq!(here.len(), 60);
    assert_eq!(here, spread, "one seeded generator behind every copy");
}
