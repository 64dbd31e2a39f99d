//! Circuit breakers on the happy path: the circuit is closed and the inner service answers at
//! once, so each row is the breaker's own cost. tower-once's `CircuitBreakerLayer` (its default
//! failure-ratio mode, and consecutive failures) beside tower-resilience's circuit breaker with
//! its defaults, over the same inner service, every call with a `Deadline` in scope. Three
//! sections:
//!
//! - `time`: nanoseconds per call, one task on a current-thread runtime;
//! - `keys`: the cost of finding a request's circuit, at 1, 1 000 and 100 000 keys (keys that
//!   cost nothing to produce: a `&'static str` in the request), and `CircuitBreakerLayer::http()`
//!   on an `http::Request<()>` for one host;
//! - `threads`: calls per second on a multi-thread runtime with 1 and 2 worker threads, 8
//!   tasks per thread sharing one layer (one set of circuits), as `retry_threads.rs` does: a
//!   contended lock or atomic on the request path shows as a ratio well under 2.
//!
//! Rows are interleaved (each round runs every row once) and summarised with
//! `support/report.rs`: medians of the rounds, ratios the medians of the per-round ratios.
//! Allocations and instructions per call are counted by `cost.rs` and `callgrind.sh`.
//!
//! ```sh
//! cargo bench --bench breaker                 # every section
//! cargo bench --bench breaker -- keys         # one section: time, keys or threads
//! ```
//!
//! Settings: `CALLS` (calls per row and round in `time` and `keys`, default 1 000 000),
//! `THREAD_CALLS` (per row, round and thread count in `threads`, default 2 000 000), `ROUNDS`
//! (default 7). `ONLY=ratio` (or `consecutive`, `resilience`, `bare`) runs one row alone on one
//! thread, for a profiler:
//!
//! ```sh
//! ONLY=ratio perf record -e cpu-clock -g target/release/deps/breaker-*
//! ```

#[path = "support/echo.rs"]
mod echo;
#[allow(dead_code)] // `seconds` is not used here
#[path = "support/env.rs"]
mod env;
#[path = "support/report.rs"]
mod report;

use echo::{Echo, Failed};
use report::{median, median_ratio, Table};
use std::fmt::Debug;
use std::future::{ready, Ready};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::runtime::Runtime;
use tower::{Layer, Service, ServiceExt};
use tower_once::breaker::CircuitBreakerLayer;
use tower_once::timeout::{Carrier, Deadline};

/// The inner service of the HTTP rows: `200 OK` at once.
#[derive(Debug, Clone, Copy)]
struct HttpOk;

impl<B> Service<http::Request<B>> for HttpOk {
    type Response = http::Response<()>;
    type Error = Failed;
    type Future = Ready<Result<http::Response<()>, Failed>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Failed>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: http::Request<B>) -> Self::Future {
        ready(Ok(http::Response::new(())))
    }
}

/// A request naming its circuit with a key that costs nothing to produce.
#[derive(Debug, Clone, Copy)]
struct Keyed {
    key: &'static str,
}

impl Carrier for Keyed {}

fn key_of(req: &Keyed) -> Option<&'static str> {
    Some(req.key)
}

/// The deadline every call runs under: far enough never to matter, in scope for every poll.
fn deadline() -> Deadline {
    Deadline::after(Duration::from_secs(3600))
}

/// Nanoseconds per call: `calls` calls, one after the other, on one task of `rt`.
fn ns_per_call<S, R>(rt: &Runtime, svc: &S, calls: u64, request: impl Fn(u64) -> R) -> f64
where
    S: Service<R> + Clone,
    S::Error: Debug,
{
    let mut svc = svc.clone();
    rt.block_on(async move {
        deadline()
            .in_scope(async move {
                let started = Instant::now();
                for i in 0..calls {
                    let out = svc.ready().await.expect("ready").call(request(i)).await;
                    std::hint::black_box(out.expect("the happy path"));
                }
                started.elapsed().as_nanos() as f64 / calls as f64
            })
            .await
    })
}

/// Calls per second on a multi-thread runtime of `threads` workers: `calls` in all, split over
/// 8 tasks per worker, every task on a service `make` returns (a clone of one service: one
/// layer, one set of circuits).
fn calls_per_second<S>(threads: usize, calls: u64, make: impl Fn() -> S) -> f64
where
    S: Service<u64> + Send + 'static,
    S::Future: Send,
    S::Error: Debug,
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
                let mut svc = make();
                tokio::spawn(deadline().in_scope(async move {
                    for i in 0..per_task {
                        let out = svc.ready().await.expect("ready").call(i).await;
                        std::hint::black_box(out.expect("the happy path"));
                        // Every call here is ready at once, so a task would run to its end in
                        // one poll, and a worker that picked 9 of the 16 tasks would finish
                        // last (16 / 18 of the ideal rate). Yielding now and then lets the
                        // other worker steal, so the rate measures the calls, not the split.
                        if i % YIELD_EVERY == YIELD_EVERY - 1 {
                            tokio::task::yield_now().await;
                        }
                    }
                }))
            })
            .collect();
        for h in handles {
            h.await.expect("task");
        }
        (per_task * tasks as u64) as f64 / started.elapsed().as_secs_f64()
    })
}

/// How often a task yields in `threads` (a yield costs about as much as a call).
const YIELD_EVERY: u64 = 1024;

/// The rows of `time` and `threads`, in this order; the last is the peer.
const ROWS: [&str; 4] = [
    "bare service",
    "tower-once `CircuitBreakerLayer::new()` (failure ratio, the default)",
    "tower-once `CircuitBreakerLayer::new().consecutive_failures(5)`",
    "tower-resilience circuit breaker, defaults",
];

/// The four services of [`ROWS`], each built once; `row` runs `f` on the one at that index.
struct Services<A, B, C, D> {
    bare: A,
    ratio: B,
    consecutive: C,
    resilience: D,
}

fn services() -> Services<
    Echo,
    impl Service<u64, Response = u64, Error: Debug, Future: Send> + Clone + Send + 'static,
    impl Service<u64, Response = u64, Error: Debug, Future: Send> + Clone + Send + 'static,
    impl Service<u64, Response = u64, Error: Debug, Future: Send> + Clone + Send + 'static,
> {
    Services {
        bare: Echo,
        ratio: CircuitBreakerLayer::new().layer(Echo),
        consecutive: CircuitBreakerLayer::new()
            .consecutive_failures(5)
            .layer(Echo),
        resilience: tower_resilience::circuitbreaker::CircuitBreakerLayer::builder()
            .build()
            .expect("the default configuration is valid")
            .layer(Echo),
    }
}

/// Runs `$f` on each service of `$s` in the order of [`ROWS`]: `[f(bare), f(ratio), ...]`.
macro_rules! each {
    ($s:expr, |$svc:ident| $f:expr) => {{
        let s = &$s;
        [
            {
                let $svc = &s.bare;
                $f
            },
            {
                let $svc = &s.ratio;
                $f
            },
            {
                let $svc = &s.consecutive;
                $f
            },
            {
                let $svc = &s.resilience;
                $f
            },
        ]
    }};
}

fn current_thread() -> Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

fn time(calls: u64, rounds: usize) {
    println!("## time: ns per call, {calls} calls per row and round, median of {rounds} interleaved rounds");
    println!();
    let rt = current_thread();
    let s = services();
    // Warm every row (first-time allocations, the thread's shard).
    each!(s, |svc| ns_per_call(&rt, svc, 1000, |i| i));
    let mut ns: [Vec<f64>; 4] = Default::default();
    for _ in 0..rounds {
        let round = each!(s, |svc| ns_per_call(&rt, svc, calls, |i| i));
        for (row, value) in ns.iter_mut().zip(round) {
            row.push(value);
        }
    }
    let peer = &ns[3];
    let table = Table::new(&[
        "row",
        "ns per call",
        "over bare",
        "ratio to tower-resilience",
    ]);
    let bare = median(ns[0].iter().copied());
    for (name, values) in ROWS.into_iter().zip(&ns) {
        let m = median(values.iter().copied());
        table.row(&[
            name.to_owned(),
            format!("{m:.1}"),
            format!("{:.1}", m - bare),
            format!("{:.3}", median_ratio(values, peer)),
        ]);
    }
    println!();
}

/// How many more calls the bare row makes in `threads`.
const BARE_FACTOR: u64 = 50;

fn threads(calls: u64, rounds: usize) {
    println!(
        "## threads: calls per second, {calls} calls per run ({} for the bare service), \
         median of {rounds} interleaved rounds",
        calls * BARE_FACTOR
    );
    println!();
    const THREADS: [usize; 2] = [1, 2];
    let s = services();
    let names = ROWS.into_iter().chain([
        "control: `CircuitBreakerLayer::new()`, a layer of its own per task (nothing shared)",
    ]);
    let mut rates: Vec<[Vec<f64>; 2]> = vec![Default::default(); ROWS.len() + 1];
    for _ in 0..rounds {
        for (t, threads) in THREADS.into_iter().enumerate() {
            // One expression for every row, the bare `Echo` (which is `Copy`) among them.
            #[allow(clippy::clone_on_copy)]
            let mut round = each!(s, |svc| calls_per_second(threads, calls, || svc.clone()));
            // The bare service takes about a nanosecond a call: with as many calls as the
            // others, a run lasts a few milliseconds and measures starting the tasks.
            round[0] = calls_per_second(threads, calls * BARE_FACTOR, || Echo);
            // The control: the same layer, but one per task, so that nothing is shared.
            let control =
                calls_per_second(threads, calls, || CircuitBreakerLayer::new().layer(Echo));
            for (row, rate) in rates.iter_mut().zip(round.into_iter().chain([control])) {
                row[t].push(rate);
            }
        }
    }
    let table = Table::new(&["row", "1 thread", "2 threads", "2 / 1"]);
    for (name, [one, two]) in names.zip(rates) {
        let (one, two) = (median(one), median(two));
        table.row(&[
            name.to_owned(),
            format!("{:.2} M/s", one / 1e6),
            format!("{:.2} M/s", two / 1e6),
            format!("{:.2}", two / one),
        ]);
    }
    println!();
}

fn keys(calls: u64, rounds: usize) {
    println!("## keys: ns per call, {calls} calls per row and round, median of {rounds} interleaved rounds");
    println!();
    // Keys made once: a request carries a `&'static str` (nothing to produce per call).
    let table: &'static [String] =
        Vec::leak((0..100_000).map(|i| format!("tenant-{i:06}")).collect());
    let keys: Vec<&'static str> = table.iter().map(String::as_str).collect();
    let keys: &'static [&'static str] = Vec::leak(keys);
    let cycle = |n: usize| {
        move |i: u64| Keyed {
            key: keys[(i % n as u64) as usize],
        }
    };
    let rt = current_thread();
    let keyed = || {
        CircuitBreakerLayer::new()
            .key_by(key_of as fn(&Keyed) -> Option<&'static str>)
            .max_circuits(100_000)
    };
    let layer_100k = keyed();
    let (k1, k1000, k100000) = (
        keyed().layer(Echo),
        keyed().layer(Echo),
        layer_100k.layer(Echo),
    );
    let unkeyed = CircuitBreakerLayer::new().layer(Echo);
    let req = http::Request::get("https://api.example.com/v1/messages")
        .body(())
        .expect("a valid request");
    let http_req = move |_: u64| req.clone();
    let http_layer = CircuitBreakerLayer::http();
    let http_svc = http_layer.layer(HttpOk);
    const NAMES: [&str; 7] = [
        "bare service, `Keyed` requests",
        "`CircuitBreakerLayer::new()`, no key (one circuit)",
        "`key_by(|r: &Keyed| Some(r.key))`, 1 key",
        "same, 1 000 keys (called in turn)",
        "same, 100 000 keys (called in turn), `max_circuits(100_000)`",
        "bare service, `http::Request<()>` (cloned per call)",
        "`CircuitBreakerLayer::http()`, one host",
    ];
    let round = |calls: u64| {
        [
            ns_per_call(&rt, &Echo, calls, cycle(1)),
            ns_per_call(&rt, &unkeyed, calls, cycle(1)),
            ns_per_call(&rt, &k1, calls, cycle(1)),
            ns_per_call(&rt, &k1000, calls, cycle(1000)),
            ns_per_call(&rt, &k100000, calls, cycle(100_000)),
            ns_per_call(&rt, &HttpOk, calls, &http_req),
            ns_per_call(&rt, &http_svc, calls, &http_req),
        ]
    };
    // Warm: every key's circuit made before the rounds.
    round(100_000);
    let mut ns: [Vec<f64>; 7] = Default::default();
    for _ in 0..rounds {
        for (row, value) in ns.iter_mut().zip(round(calls)) {
            row.push(value);
        }
    }
    // Every key has a circuit of its own (none shares the overflow circuit): the default,
    // the overflow one and 100 000 keyed ones.
    assert_eq!(layer_100k.circuits().all().len(), 100_002);
    assert!(layer_100k.circuits().find(keys[99_999]).is_some());
    let out = Table::new(&["row", "ns per call", "over the bare row"]);
    let (bare, bare_http) = (median(ns[0].iter().copied()), median(ns[5].iter().copied()));
    for (i, (name, values)) in NAMES.into_iter().zip(&ns).enumerate() {
        let m = median(values.iter().copied());
        let over = if i >= 5 { m - bare_http } else { m - bare };
        out.row(&[name.to_owned(), format!("{m:.1}"), format!("{over:.1}")]);
    }
    println!();
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let calls: u64 = env::var("CALLS", 1_000_000, 1..=u64::MAX);
    let thread_calls: u64 = env::var("THREAD_CALLS", 2_000_000, 16..=u64::MAX);
    let rounds: usize = env::var("ROUNDS", 7, 1..=1000);
    if let Ok(only) = std::env::var("ONLY") {
        let rt = current_thread();
        let s = services();
        let ns = match only.as_str() {
            "bare" => ns_per_call(&rt, &s.bare, calls, |i| i),
            "ratio" => ns_per_call(&rt, &s.ratio, calls, |i| i),
            "consecutive" => ns_per_call(&rt, &s.consecutive, calls, |i| i),
            "resilience" => ns_per_call(&rt, &s.resilience, calls, |i| i),
            other => panic!("ONLY is one of bare, ratio, consecutive, resilience; not {other}"),
        };
        println!("{only}: {ns:.1} ns per call, 1 thread");
        return;
    }
    let all = args.is_empty();
    let wants = |section: &str| all || args.iter().any(|a| a == section);
    if wants("time") {
        time(calls, rounds);
    }
    if wants("keys") {
        keys(calls, rounds);
    }
    if wants("threads") {
        threads(thread_calls, rounds);
    }
}
