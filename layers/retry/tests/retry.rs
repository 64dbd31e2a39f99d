//! `RetryLayer`'s semantics table (crate docs "Semantics" and "HTTP":
//! which outcomes are retried, backoff with jitter, `Retry-After`, attempts, one deadline,
//! the hook, the seed and the budget), on tokio's paused clock. Every test counts the inner calls.

use http::{Response, StatusCode};
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;
use tower::{Layer, Service, ServiceBuilder, ServiceExt};
use tower_once_retry::backoff::{Backoff, Jitter};
use tower_once_retry::budget::RetryBudget;
use tower_once_retry::classify::HttpClassifier;
use tower_once_retry::hook::RetryEvent;
use tower_once_retry::{GiveUp, RetryLayer};
use tower_once_timeout::TimeoutLayer;

/// An upstream that answers a script of statuses (the last one repeats), recording when each
/// call arrived. `0` in the script means "hang forever".
#[derive(Clone)]
struct Upstream {
    script: Arc<Vec<(u16, Option<&'static str>)>>,
    calls: Arc<Mutex<Vec<Instant>>>,
}

impl Upstream {
    fn new(script: &[(u16, Option<&'static str>)]) -> Self {
        Self {
            script: Arc::new(script.to_vec()),
            calls: Arc::default(),
        }
    }
    fn statuses(statuses: &[u16]) -> Self {
        Self::new(&statuses.iter().map(|s| (*s, None)).collect::<Vec<_>>())
    }
    fn calls(&self) -> usize {
        self.calls.lock().unwrap().len()
    }
    fn gaps(&self) -> Vec<Duration> {
        let calls = self.calls.lock().unwrap();
        calls.windows(2).map(|w| w[1] - w[0]).collect()
    }
}

impl Service<u32> for Upstream {
    type Response = Response<()>;
    type Error = &'static str;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Response<()>, &'static str>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: u32) -> Self::Future {
        let n = {
            let mut calls = self.calls.lock().unwrap();
            calls.push(Instant::now());
            calls.len() - 1
        };
        let (status, retry_after) = self.script[n.min(self.script.len() - 1)];
        Box::pin(async move {
            match status {
                0 => std::future::pending().await,
                1 => Err("connection reset"),
                _ => {
                    let mut res = Response::new(());
                    *res.status_mut() = StatusCode::from_u16(status).unwrap();
                    if let Some(after) = retry_after {
                        res.headers_mut()
                            .insert("retry-after", after.parse().unwrap());
                    }
                    Ok(res)
                }
            }
        })
    }
}

fn http_layer() -> RetryLayer<HttpClassifier> {
    RetryLayer::new().classify(HttpClassifier).rng_seed(1)
}

#[tokio::test(start_paused = true)]
async fn two_503s_then_200_take_three_calls_with_jittered_waits() {
    let upstream = Upstream::statuses(&[503, 503, 200]);
    let res = http_layer()
        .layer(upstream.clone())
        .oneshot(1)
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(upstream.calls(), 3);
    let gaps = upstream.gaps();
    // Full jitter: the first wait is within [0, 500 ms], the second within [0, 1 s].
    assert!(gaps[0] <= Duration::from_millis(500), "{gaps:?}");
    assert!(gaps[1] <= Duration::from_secs(1), "{gaps:?}");
}

#[tokio::test(start_paused = true)]
async fn a_400_is_not_retried() {
    let upstream = Upstream::statuses(&[400, 200]);
    let res = http_layer()
        .layer(upstream.clone())
        .oneshot(1)
        .await
        .unwrap();
    assert_eq!(res.status(), 400);
    assert_eq!(upstream.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn retry_after_is_honoured_exactly_and_capped() {
    let upstream = Upstream::new(&[(429, Some("2")), (200, None)]);
    http_layer()
        .layer(upstream.clone())
        .oneshot(1)
        .await
        .unwrap();
    assert_eq!(
        upstream.gaps(),
        [Duration::from_secs(2)],
        "waited the server's 2 s, not the backoff"
    );

    let upstream = Upstream::new(&[(503, Some("3600")), (200, None)]);
    let layer = http_layer().retry_after_cap(Duration::from_secs(5));
    layer.layer(upstream.clone()).oneshot(1).await.unwrap();
    assert_eq!(upstream.gaps(), [Duration::from_secs(5)], "capped");
}

#[tokio::test(start_paused = true)]
async fn a_wait_past_the_deadline_gives_up_at_once() {
    let upstream = Upstream::new(&[(503, Some("20")), (200, None)]);
    let layer = http_layer().deadline(Duration::from_secs(10));
    let started = Instant::now();
    let res = layer.layer(upstream.clone()).oneshot(1).await.unwrap();
    assert_eq!(res.status(), 503, "the last response is returned");
    assert_eq!(started.elapsed(), Duration::ZERO, "no sleep in vain");
    assert_eq!(upstream.calls(), 1);
    assert_eq!(layer.stats().give_ups, 1);
}

#[tokio::test(start_paused = true)]
async fn conflict_retries_only_with_retry_after() {
    let upstream = Upstream::new(&[(409, Some("1")), (201, None)]);
    assert_eq!(
        http_layer()
            .layer(upstream.clone())
            .oneshot(1)
            .await
            .unwrap()
            .status(),
        201
    );
    assert_eq!(upstream.calls(), 2);
    let upstream = Upstream::statuses(&[409, 201]);
    assert_eq!(
        http_layer()
            .layer(upstream.clone())
            .oneshot(1)
            .await
            .unwrap()
            .status(),
        409
    );
    assert_eq!(upstream.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn exhausted_attempts_return_the_last_response_or_a_typed_error() {
    let upstream = Upstream::statuses(&[503]);
    let layer = http_layer();
    let res = layer.layer(upstream.clone()).oneshot(1).await.unwrap();
    assert_eq!(res.status(), 503);
    assert_eq!(upstream.calls(), 4, "4 attempts in all by default");

    let upstream = Upstream::statuses(&[1]);
    let err = http_layer()
        .layer(upstream.clone())
        .oneshot(1)
        .await
        .unwrap_err();
    assert_eq!(err.reason(), GiveUp::Exhausted);
    assert_eq!(err.attempts(), 4);
    assert_eq!(err.get_inner(), Some(&"connection reset"));
    assert_eq!(upstream.calls(), 4);
    let s = layer.stats();
    assert_eq!(
        (s.operations, s.attempts, s.retries, s.give_ups),
        (1, 4, 3, 1)
    );
}

#[tokio::test(start_paused = true)]
async fn three_nested_layers_make_at_most_four_calls() {
    let upstream = Upstream::statuses(&[503]);
    let svc = ServiceBuilder::new()
        .layer(http_layer())
        .layer(http_layer())
        .layer(http_layer())
        .service(upstream.clone());
    let res = svc.oneshot(1).await.unwrap();
    assert_eq!(res.status(), 503);
    assert_eq!(upstream.calls(), 4, "not 4 x 4 x 4 = 64");
}

#[tokio::test(start_paused = true)]
async fn attempts_and_waits_fit_in_one_deadline_with_a_timeout_per_attempt() {
    // The upstream hangs; each attempt is cut at 200 ms; the operation has 1 s.
    let upstream = Upstream::statuses(&[0]);
    let backoff = Backoff::new(Duration::from_millis(100), 1.0, Duration::from_millis(100))
        .unwrap()
        .jitter(Jitter::None);
    let svc = ServiceBuilder::new()
        .layer(
            RetryLayer::new()
                .max_attempts(10)
                .deadline(Duration::from_secs(1))
                .backoff(backoff),
        )
        .layer(TimeoutLayer::new(Duration::from_millis(200)))
        .service(upstream.clone());
    let started = Instant::now();
    let err = svc.oneshot(1).await.unwrap_err();
    assert_eq!(
        started.elapsed(),
        Duration::from_secs(1),
        "ended exactly at the deadline"
    );
    // 0-200, 300-500, 600-800, 900-1000 (the last cut by the deadline, not the limit).
    assert_eq!(upstream.calls(), 4);
    assert_eq!(err.reason(), GiveUp::Deadline);
    assert!(err
        .get_inner()
        .and_then(|e| e.elapsed())
        .is_some_and(|e| e.is_deadline()));
}

#[tokio::test(start_paused = true)]
async fn the_hook_sees_each_retry() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let layer = http_layer().on_retry(move |e: &RetryEvent<'_, Response<()>, &'static str>| {
        let status = e.outcome.as_ref().map(|r| r.status().as_u16()).unwrap_or(0);
        log.lock()
            .unwrap()
            .push((e.attempt, status, e.delay, e.from_server));
    });
    let upstream = Upstream::new(&[(503, None), (429, Some("3")), (200, None)]);
    layer.layer(upstream.clone()).oneshot(1).await.unwrap();
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2);
    assert_eq!((seen[0].0, seen[0].1, seen[0].3), (1, 503, false));
    assert_eq!(seen[1], (2, 429, Duration::from_secs(3), true));
    // The hook is told the delay requested; tokio's timer wakes within 1 ms after it.
    for (gap, (_, _, delay, _)) in upstream.gaps().into_iter().zip(&seen) {
        assert!(
            gap >= *delay && gap - *delay < Duration::from_millis(1),
            "{gap:?} vs {delay:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_seed_makes_delays_reproducible() {
    let run = || async {
        let upstream = Upstream::statuses(&[503]);
        http_layer()
            .rng_seed(42)
            .layer(upstream.clone())
            .oneshot(1)
            .await
            .unwrap();
        upstream.gaps()
    };
    let (a, b) = (run().await, run().await);
    assert_eq!(a, b);
    assert_eq!(a.len(), 3);
}

#[tokio::test(start_paused = true)]
async fn the_budget_refuses_retries_beyond_its_share() {
    let budget = RetryBudget::new(0.0, 1, Duration::from_secs(10)); // 10 retries per window
    let layer = http_layer().budget(budget).max_attempts(2);
    let upstream = Upstream::statuses(&[503]);
    for _ in 0..20 {
        layer.layer(upstream.clone()).oneshot(1).await.unwrap();
    }
    let s = layer.stats();
    assert_eq!(s.retries, 10);
    assert_eq!(s.budget_refusals, 10);
    assert_eq!(upstream.calls(), 30, "20 first attempts + 10 retries");
}

/// 10 000 logical requests over 10 s: the budget keeps a full outage from multiplying load,
/// and costs nothing when failures are rare.
#[tokio::test(start_paused = true)]
async fn a_retry_storm_is_contained_by_the_budget() {
    async fn storm(layer: RetryLayer, failure_rate: f64) -> (u64, u64) {
        let calls = Arc::new(AtomicU64::new(0));
        let successes = Arc::new(AtomicU64::new(0));
        let rng = Arc::new(Mutex::new(fastrand::Rng::with_seed(7)));
        let upstream = {
            let calls = calls.clone();
            tower::service_fn(move |_: u32| {
                calls.fetch_add(1, SeqCst);
                let fail = rng.lock().unwrap().f64() < failure_rate;
                async move {
                    if fail {
                        Err("unavailable")
                    } else {
                        Ok(())
                    }
                }
            })
        };
        let svc = layer.layer(upstream);
        let tasks: Vec<_> = (0..10_000u32)
            .map(|i| {
                let svc = svc.clone();
                let successes = successes.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(u64::from(i))).await;
                    if svc.oneshot(i).await.is_ok() {
                        successes.fetch_add(1, SeqCst);
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
        (calls.load(SeqCst), successes.load(SeqCst))
    }

    let (unbudgeted, _) = storm(RetryLayer::new().rng_seed(3).no_budget(), 1.0).await;
    let (budgeted, _) = storm(RetryLayer::new().rng_seed(3), 1.0).await;
    let (calls, ok) = storm(RetryLayer::new().rng_seed(3), 0.05).await;
    println!(
        "storm: 10000 requests, 100% failing: {unbudgeted} calls without a budget ({:.2}x), \
         {budgeted} with the default budget ({:.2}x); 5% failing: {calls} calls, {ok} succeeded ({:.2}%)",
        unbudgeted as f64 / 1e4,
        budgeted as f64 / 1e4,
        ok as f64 / 100.0
    );
    assert_eq!(unbudgeted, 40_000);
    assert!(budgeted as f64 <= 1.25 * 10_000.0, "{budgeted}");
    assert!(ok as f64 >= 0.995 * 10_000.0, "{ok}");
}

/// A retry hook that panics on its first call, then watches quietly.
fn panics_once(
) -> impl Fn(&RetryEvent<'_, Response<()>, &'static str>) + Clone + Send + Sync + 'static {
    let armed = Arc::new(std::sync::atomic::AtomicBool::new(true));
    move |_: &RetryEvent<'_, Response<()>, &'static str>| {
        if armed.swap(false, SeqCst) {
            panic!("the retry hook failed");
        }
    }
}

/// A hook that panics before a retry is sent is contained (crate docs: a hook that panics is
/// logged and the layer goes on): the retry goes out, and it is the only one it spent from the
/// budget: the window's other nine retries are there for later operations.
#[tokio::test(start_paused = true)]
async fn a_retry_hook_that_panics_is_contained_and_the_retry_goes_out() {
    let budget = RetryBudget::new(0.0, 1, Duration::from_secs(10)); // 10 retries per window
    let layer = http_layer()
        .budget(budget)
        .max_attempts(2)
        .on_retry(panics_once());
    let upstream = Upstream::statuses(&[503]);
    let first = layer.layer(upstream.clone()).oneshot(1).await.unwrap();
    assert_eq!(first.status(), 503, "the last answer, after the retry");
    assert_eq!(
        upstream.calls(),
        2,
        "the retry whose hook panicked went out"
    );
    for _ in 0..19 {
        layer.layer(upstream.clone()).oneshot(1).await.unwrap();
    }
    assert_eq!(
        upstream.calls(),
        30,
        "20 first attempts + the window's 10 retries"
    );
}

/// After the hook panicked once, the layer retries as before (no lock left poisoned by the
/// seeded random source) and nothing is sent twice.
#[tokio::test(start_paused = true)]
async fn after_a_retry_hook_panicked_later_operations_still_retry() {
    let layer = http_layer()
        .no_budget()
        .max_attempts(3)
        .on_retry(panics_once());
    let upstream = Upstream::statuses(&[503, 503, 200]);
    let res = layer.layer(upstream.clone()).oneshot(1).await.unwrap();
    assert_eq!(res.status(), 200, "retried twice: two 503s, then the 200");
    assert_eq!(upstream.calls(), 3);
    let res = layer.layer(upstream.clone()).oneshot(1).await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(upstream.calls(), 4);
}
