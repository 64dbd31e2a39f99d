//! Does the retry layer scale across cores? Calls per second on a multi-thread tokio runtime
//! with 1 and with 2 worker threads (this machine has 2 cores), tasks on every thread sharing
//! one layer (so one retry budget and one set of counters), beside no retry and
//! tower-resilience's retry on the same happy path. A process-wide lock or a contended atomic
//! on the request path shows as a ratio well under 2.
//!
//! ```sh
//! cargo bench --bench retry_threads --features retry     # CALLS=2000000 by default
//! ```
//!
//! `ONLY=once` (or `resilience`, `none`) runs one service alone, 1 thread, for a profiler:
//!
//! ```sh
//! ONLY=once perf record -e cpu-clock -g target/release/deps/retry_threads-*
//! ```

#[path = "support/echo.rs"]
mod echo;
#[path = "support/report.rs"]
mod report;

use echo::Failed;
use report::{median, Table};
use std::time::{Duration, Instant};
use tower::{Layer, Service, ServiceExt};
use tower_once::retry::RetryLayer;

fn inner() -> impl Service<u64, Response = u64, Error = Failed, Future: Send> + Clone + Send {
    tower::service_fn(|x: u64| async move { Ok::<_, Failed>(x + 1) })
}

/// The services each round runs, in this order.
const SERVICES: [&str; 3] = [
    "no retry",
    "tower-once `RetryLayer` (deadline, budget)",
    "tower-resilience retry",
];
/// Worker threads of the runtime, per round.
const THREADS: [usize; 2] = [1, 2];
const ROUNDS: usize = 5;

/// Calls per second: `calls` in all, split over 8 tasks per worker thread.
fn run<S>(threads: usize, calls: u64, svc: S) -> f64
where
    S: Service<u64, Response = u64> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: std::fmt::Debug,
{
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let tasks = threads * 8;
        let per_task = calls / tasks as u64;
        let started = Instant::now();
        let handles: Vec<_> = (0..tasks)
            .map(|_| {
                let mut svc = svc.clone();
                tokio::spawn(async move {
                    for i in 0..per_task {
                        let out = svc.ready().await.expect("ready").call(i).await;
                        assert_eq!(out.expect("ok"), i + 1);
                    }
                })
            })
            .collect();
        for h in handles {
            h.await.expect("task");
        }
        (per_task * tasks as u64) as f64 / started.elapsed().as_secs_f64()
    })
}

fn main() {
    let calls: u64 = std::env::var("CALLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000_000);
    let once = RetryLayer::new().layer(inner());
    let resilience = tower_resilience::retry::RetryLayer::<u64, u64, Failed>::builder()
        .max_attempts(4)
        .exponential_backoff(Duration::from_millis(500))
        .build()
        .layer(inner());
    if let Ok(only) = std::env::var("ONLY") {
        let rate = match only.as_str() {
            "once" => run(1, calls, once),
            "resilience" => run(1, calls, resilience),
            "none" => run(1, calls, inner()),
            other => panic!("ONLY is one of once, resilience, none; not {other}"),
        };
        println!("{only}: {:.2} M calls per second, 1 thread", rate / 1e6);
        return;
    }
    println!("calls per second, {calls} calls per run, median of {ROUNDS} interleaved rounds");
    println!();
    // Per service, per thread count: one rate per round.
    let mut rates: Vec<[Vec<f64>; 2]> = vec![[Vec::new(), Vec::new()]; SERVICES.len()];
    for _ in 0..ROUNDS {
        for (t, threads) in THREADS.into_iter().enumerate() {
            // In the order of SERVICES.
            let round = [
                run(threads, calls, inner()),
                run(threads, calls, once.clone()),
                run(threads, calls, resilience.clone()),
            ];
            for (service, rate) in rates.iter_mut().zip(round) {
                service[t].push(rate);
            }
        }
    }
    let table = Table::new(&["service", "1 thread", "2 threads", "2 / 1"]);
    for (name, [one, two]) in SERVICES.into_iter().zip(rates) {
        let (one, two) = (median(one), median(two));
        table.row(&[
            name.to_owned(),
            format!("{:.2} M", one / 1e6),
            format!("{:.2} M", two / 1e6),
            format!("{:.2}", two / one),
        ]);
    }
}
