//! The retry budget and the settings shared by every clone (crate docs: "a retry budget shared by
//! every clone of the layer"; retry crate docs: a budget shared by all
//! clones; `rng_seed` makes delays reproducible): the per-thread copies of the layer's settings
//! share one budget, one set of counters and one seeded generator, whichever threads and runtimes
//! call them. The multi-thread tests assert counts, never durations.

mod support;

use http::StatusCode;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::{fixed, get, http_upstream};
use tower::{Layer, Service, ServiceExt};
use tower_once_retry::backoff::Backoff;
use tower_once_retry::budget::RetryBudget;
use tower_once_retry::classify::HttpClassifier;
use tower_once_retry::hook::RetryEvent;
use tower_once_retry::RetryLayer;

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

/// Calls on many threads reach their own thread's copy of the layer's settings; the copies must
/// still share one set of counters and one budget.
#[test]
fn calls_on_many_threads_share_one_budget_and_one_set_of_counters() {
    let failing = tower::service_fn(|_req: u32| async { Err::<(), _>("down") });
    let layer = RetryLayer::new()
        .max_attempts(2)
        .backoff(
            tower_once_retry::backoff::Backoff::new(
                Duration::from_millis(1),
                1.0,
                Duration::from_millis(1),
            )
            .unwrap(),
        )
        // No floor: 10 % of the requests, across every thread.
        .budget(tower_once_retry::budget::RetryBudget::new(
            0.1,
            0,
            Duration::from_secs(60),
        ));
    let svc = layer.layer(failing);
    support::calls_on_threads(12, 50, |_| svc.clone());
    let stats = layer.stats();
    assert_eq!(stats.operations, 600, "{stats:?}");
    // 10 % of 600 requests, give or take the budget's documented edge races.
    assert!(
        (50..=75).contains(&stats.retries),
        "one budget for every thread: {stats:?}"
    );
    assert_eq!(stats.attempts, 600 + stats.retries, "{stats:?}");
}
