//! Per-request cost of each layer's happy path, counted rather than timed: heap allocations
//! (a counting global allocator, `dhat` in testing mode) and, under
//! `valgrind --tool=callgrind`, instructions. Counts are stable on a noisy machine, unlike
//! nanoseconds. Peers run in the same binary: a bare axum handler, `tower::retry`,
//! `tower::timeout`, `tower::hedge` and `tower-resilience`'s retry and circuit breaker. The
//! retry and timeout `u64` services (the bare one included) are boxed the same way, so compare
//! each with `no_retry`, not with zero; the breaker and hedge cases are not boxed (their
//! services are called directly, every call with a `Deadline` in scope), so compare them with
//! `echo`, the inner service alone.
//!
//! ```sh
//! cargo bench --bench cost               # allocations per request, every case
//! bash benches/callgrind.sh              # instructions per request, every case
//! cargo bench --bench cost -- fresh 1000 # one case, N requests, no counting (for callgrind)
//! cargo bench --bench cost -- circuits   # heap bytes a keyed circuit holds
//! ```

#![allow(missing_docs)]

#[path = "support/echo.rs"]
mod echo;
#[path = "support/report.rs"]
mod report;

use axum::body::{Body, Bytes};
use axum::routing::post;
use axum::Router;
use echo::{Echo, Failed};
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use report::Table;
use std::future::{ready, Ready};
use std::time::Duration;
use tower::{Layer, Service, ServiceExt};
use tower_once::idempotency::IdempotencyLayer;
use tower_once::retry::RetryLayer;
use tower_once::timeout::TimeoutLayer;

#[global_allocator]
static ALLOC: dhat::Alloc = dhat::Alloc;

const CASES: [&str; 18] = [
    "bare",
    "fresh",
    "replay",
    "no_retry",
    "tower_retry",
    "resilience_retry",
    "once_retry",
    "tower_timeout",
    "once_timeout",
    "echo",
    "resilience_breaker",
    "once_breaker",
    "once_breaker_consecutive",
    "once_breaker_keyed",
    "tower_hedge",
    "once_hedge",
    "tower_hedge_unarmed",
    "once_hedge_percentile",
];

async fn create(body: Bytes) -> (StatusCode, [(&'static str, &'static str); 1], String) {
    (
        StatusCode::CREATED,
        [("content-type", "application/json")],
        format!(r#"{{"id":"ch_1","received":{}}}"#, body.len()),
    )
}

/// Answers the heap bytes live while it runs: what a request holds in flight.
async fn probe(body: Bytes) -> String {
    let live = dhat::HeapStats::get().curr_bytes;
    drop(body);
    live.to_string()
}

/// Heap bytes a request holds while its handler runs, counted from just before the call (the
/// request's own allocations included, so the bare figure can be below zero).
async fn in_flight(router: &Router, key: &str, body: &Bytes) -> i64 {
    let req = Request::post("/probe")
        .header("idempotency-key", key)
        .body(Body::from(body.clone()))
        .expect("static request parts are valid");
    let before = dhat::HeapStats::get().curr_bytes as i64;
    let res = ServiceExt::<Request<Body>>::oneshot(router.clone(), req)
        .await
        .expect("router is infallible");
    let body = res.into_body().collect().await.expect("in-memory body");
    let live: i64 = std::str::from_utf8(&body.to_bytes())
        .ok()
        .and_then(|s| s.parse().ok())
        .expect("the probe answers a number");
    live - before
}

/// Prints what a covered request holds while its handler runs (over the same request without
/// the layer), and what each stored record keeps, in heap bytes.
fn memory(rt: &tokio::runtime::Runtime) {
    let bare = Router::new().route("/probe", post(probe)).with_state(());
    let layered = Router::new()
        .route("/probe", post(probe))
        .layer(IdempotencyLayer::new())
        .with_state(());
    let _profiler = dhat::Profiler::builder().testing().build();
    rt.block_on(async {
        for (label, size) in [("1 KiB", 1024), ("64 KiB", 64 * 1024)] {
            let body = Bytes::from(vec![b'a'; size]);
            // Warm both (first-time allocations, in every shard of the store).
            in_flight(&bare, "w", &body).await;
            for n in 0..256 {
                in_flight(&layered, &format!("w-{size}-{n}"), &body).await;
            }
            // Averaged over many keys: the store's own structures grow in steps (map, index
            // nodes), which one request alone would count or miss by chance.
            const PROBES: i64 = 512;
            let (mut bare_bytes, mut layered_bytes) = (0, 0);
            for n in 0..PROBES {
                bare_bytes += in_flight(&bare, "b", &body).await;
                layered_bytes += in_flight(&layered, &format!("l-{size}-{n}"), &body).await;
            }
            let (bare_bytes, layered_bytes) = (bare_bytes / PROBES, layered_bytes / PROBES);
            println!(
                "in flight, {label} body: the layer holds {} B more than the bare handler \
                 ({layered_bytes} B against {bare_bytes} B)",
                layered_bytes - bare_bytes
            );
        }
        let body = Bytes::from(vec![b'a'; 1024]);
        const N: usize = 10_000;
        let before = dhat::HeapStats::get().curr_bytes;
        for i in 0..N {
            let mut req = request(&format!("m-{i}"), &body);
            *req.uri_mut() = http::Uri::from_static("/probe");
            call(&layered, req).await;
        }
        let after = dhat::HeapStats::get().curr_bytes;
        println!(
            "stored record (memory store, {N} records, a response of a few bytes and one \
             header): {} B each",
            (after - before) / N
        );
    });
}

fn request(key: &str, body: &Bytes) -> Request<Body> {
    Request::post("/charges")
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(Body::from(body.clone()))
        .expect("static request parts are valid")
}

async fn call(router: &Router, req: Request<Body>) {
    let res = ServiceExt::<Request<Body>>::oneshot(router.clone(), req)
        .await
        .expect("router is infallible");
    assert!(res.status().is_success());
    res.into_body().collect().await.expect("in-memory body");
}

fn inner() -> impl Service<u64, Response = u64, Error = Failed, Future: Send> + Clone + Send {
    tower::service_fn(|x: u64| async move { Ok::<_, Failed>(x + 1) })
}

#[derive(Clone)]
struct Attempts(usize);

impl tower::retry::Policy<u64, u64, Failed> for Attempts {
    type Future = Ready<()>;
    fn retry(&mut self, _: &mut u64, result: &mut Result<u64, Failed>) -> Option<Self::Future> {
        match result {
            Err(_) if self.0 > 0 => {
                self.0 -= 1;
                Some(ready(()))
            }
            _ => None,
        }
    }
    fn clone_request(&mut self, req: &u64) -> Option<u64> {
        Some(*req)
    }
}

/// `n` calls on one service (no clone per call: a boxed service's clone would allocate).
async fn calls(svc: &BoxSvc, n: u64) {
    let mut svc = svc.clone();
    for _ in 0..n {
        let ready = svc.ready().await.expect("ready");
        ready.call(41).await.expect("happy path");
    }
}

/// Runs `n` requests of `case`; fresh keys are numbered so every run is a new one.
async fn run(case: &str, n: u64, routers: &Routers) {
    if routers.direct.run(case, n).await {
        return;
    }
    let body = Bytes::from(vec![b'a'; 1024]);
    let svc = match case {
        "bare" | "fresh" | "replay" => None,
        "no_retry" => Some(&routers.bare_svc),
        "tower_retry" => Some(&routers.tower_retry),
        "resilience_retry" => Some(&routers.resilience),
        "once_retry" => Some(&routers.once_retry),
        "tower_timeout" => Some(&routers.tower_timeout),
        "once_timeout" => Some(&routers.once_timeout),
        other => panic!("unknown case {other}; one of {CASES:?}"),
    };
    if let Some(svc) = svc {
        return calls(svc, n).await;
    }
    for i in 0..n {
        match case {
            "bare" => call(&routers.bare, request("k", &body)).await,
            "fresh" => call(&routers.layered, request(&format!("f-{i}"), &body)).await,
            _ => call(&routers.layered, request("replayed", &body)).await,
        }
    }
}

type BoxSvc = tower::util::BoxCloneSyncService<u64, u64, tower::BoxError>;

struct Routers {
    direct: Direct,
    bare: Router,
    bare_svc: BoxSvc,
    layered: Router,
    tower_retry: BoxSvc,
    resilience: BoxSvc,
    once_retry: BoxSvc,
    tower_timeout: BoxSvc,
    once_timeout: BoxSvc,
}

fn boxed<S>(svc: S) -> BoxSvc
where
    S: Service<u64, Response = u64> + Clone + Send + Sync + 'static,
    S::Error: Into<tower::BoxError>,
    S::Future: Send + 'static,
{
    tower::util::BoxCloneSyncService::new(
        tower::ServiceBuilder::new()
            .map_err(Into::into)
            .service(svc),
    )
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let routers = rt.block_on(async {
        Routers {
            direct: Direct::new(),
            // `with_state` turns handlers into routes once, as `axum::serve` does; without it
            // axum re-applies every layer on each request.
            bare: Router::new().route("/charges", post(create)).with_state(()),
            layered: Router::new()
                .route("/charges", post(create))
                .layer(IdempotencyLayer::new())
                .with_state(()),
            bare_svc: boxed(inner()),
            tower_retry: boxed(tower::retry::RetryLayer::new(Attempts(3)).layer(inner())),
            resilience: boxed(
                tower_resilience::retry::RetryLayer::<u64, u64, Failed>::builder()
                    .max_attempts(4)
                    .exponential_backoff(Duration::from_millis(500))
                    .build()
                    .layer(inner()),
            ),
            once_retry: boxed(RetryLayer::new().layer(inner())),
            tower_timeout: boxed(
                tower::timeout::TimeoutLayer::new(Duration::from_secs(5)).layer(inner()),
            ),
            once_timeout: boxed(TimeoutLayer::new(Duration::from_secs(5)).layer(inner())),
        }
    });
    // Warm every path (first-time allocations, the replayed record, every key's circuit).
    rt.block_on(async {
        for case in CASES {
            run(case, 2, &routers).await;
        }
        routers.direct.warm().await;
    });
    if let [mode, case, n] = args.as_slice() {
        // `profile CASE N`: a dhat heap profile (dhat-heap.json) of N requests of one case, to
        // see where each allocation comes from.
        assert_eq!(mode, "profile", "usage: [profile] CASE N");
        let n = n.parse().expect("a request count");
        let _profiler = dhat::Profiler::new_heap();
        rt.block_on(run(case, n, &routers));
        return;
    }
    if let [case, n] = args.as_slice() {
        // One case, uncounted: for callgrind (benches/callgrind.sh).
        let n = n.parse().expect("a request count");
        rt.block_on(run(case, n, &routers));
        return;
    }
    if let [mode] = args.as_slice() {
        match mode.as_str() {
            "memory" => memory(&rt),
            "circuits" => circuits(&rt),
            _ => panic!("usage: memory | circuits | CASE N | profile CASE N"),
        }
        return;
    }
    const N: u64 = 1000;
    let table = Table::new(&["case", "allocs/request", "bytes/request"]);
    for case in CASES {
        let _profiler = dhat::Profiler::builder().testing().build();
        let before = dhat::HeapStats::get();
        rt.block_on(run(case, N, &routers));
        let after = dhat::HeapStats::get();
        table.row(&[
            case.to_owned(),
            format!(
                "{:.1}",
                (after.total_blocks - before.total_blocks) as f64 / N as f64
            ),
            format!(
                "{:.0}",
                (after.total_bytes - before.total_bytes) as f64 / N as f64
            ),
        ]);
    }
}

/// A request naming its circuit with a key that costs nothing to produce.
#[derive(Debug, Clone, Copy)]
struct Keyed {
    key: &'static str,
}

impl tower_once::timeout::Carrier for Keyed {}

type KeyOf = fn(&Keyed) -> Option<&'static str>;

fn key_of(req: &Keyed) -> Option<&'static str> {
    Some(req.key)
}

/// `n` keys made once (leaked: they live as long as the bench).
fn keys(n: usize) -> &'static [&'static str] {
    Vec::leak(
        (0..n)
            .map(|i| &*String::leak(format!("tenant-{i:06}")))
            .collect(),
    )
}

/// tower's hedge policy: hedge every request (a `u64` is copied).
#[derive(Debug, Clone, Copy)]
struct HedgeAll;

impl tower::hedge::Policy<u64> for HedgeAll {
    fn clone_request(&self, req: &u64) -> Option<u64> {
        Some(*req)
    }

    fn can_retry(&self, _: &u64) -> bool {
        true
    }
}

type TowerHedge = std::cell::RefCell<Option<tower::hedge::Hedge<Echo, HedgeAll>>>;

/// The breaker and hedge cases: services called directly (their futures not boxed), as the
/// timed benches (`breaker.rs`, `hedge.rs`) call them.
struct Direct {
    once_breaker: tower_once::breaker::CircuitBreaker<Echo>,
    once_breaker_consecutive: tower_once::breaker::CircuitBreaker<Echo>,
    resilience_breaker: tower_resilience::circuitbreaker::CircuitBreaker<
        Echo,
        tower_resilience::circuitbreaker::DefaultClassifier,
    >,
    once_breaker_keyed: tower_once::breaker::CircuitBreaker<Echo, KeyOf>,
    keys: &'static [&'static str],
    once_hedge: tower_once::hedge::Hedge<Echo>,
    once_hedge_percentile: tower_once::hedge::Hedge<Echo>,
    // tower's `Hedge` is not `Clone`: taken out for a run, put back after.
    tower_hedge: TowerHedge,
    tower_hedge_unarmed: TowerHedge,
}

impl Direct {
    /// Built inside the runtime (tokio's clock and timers).
    fn new() -> Self {
        use tower_once::breaker::CircuitBreakerLayer;
        let latencies: Vec<u64> = (1..=100).collect();
        Self {
            once_breaker: CircuitBreakerLayer::new().layer(Echo),
            once_breaker_consecutive: CircuitBreakerLayer::new()
                .consecutive_failures(5)
                .layer(Echo),
            resilience_breaker: tower_resilience::circuitbreaker::CircuitBreakerLayer::builder()
                .build()
                .expect("the default configuration is valid")
                .layer(Echo),
            once_breaker_keyed: CircuitBreakerLayer::new()
                .key_by(key_of as KeyOf)
                .layer(Echo),
            keys: keys(1000),
            once_hedge: tower_once::hedge::HedgeLayer::new(Duration::from_millis(100)).layer(Echo),
            once_hedge_percentile: tower_once::hedge::HedgeLayer::latency_percentile(
                0.9,
                u64::MAX,
                Duration::from_secs(10),
            )
            .layer(Echo),
            // Armed: a 90 ms delay (the 90th percentile of 1..=100 ms), never rotated.
            tower_hedge: std::cell::RefCell::new(Some(
                tower::hedge::Hedge::new_with_mock_latencies(
                    Echo,
                    HedgeAll,
                    10,
                    0.9,
                    Duration::from_secs(3600),
                    &latencies,
                ),
            )),
            // Not armed: too few data points, however long it runs.
            tower_hedge_unarmed: std::cell::RefCell::new(Some(tower::hedge::Hedge::new(
                Echo,
                HedgeAll,
                u64::MAX,
                0.9,
                Duration::from_secs(10),
            ))),
        }
    }

    /// Makes every key's circuit, so that the keyed case counts finding a circuit, not making
    /// one.
    async fn warm(&self) {
        self.run("once_breaker_keyed", self.keys.len() as u64).await;
    }

    /// Runs `n` calls of `case` if it is one of these; `false` if not.
    async fn run(&self, case: &str, n: u64) -> bool {
        match case {
            "echo" => direct(&mut Echo, n, |i| i).await,
            "resilience_breaker" => direct(&mut self.resilience_breaker.clone(), n, |i| i).await,
            "once_breaker" => direct(&mut self.once_breaker.clone(), n, |i| i).await,
            "once_breaker_consecutive" => {
                direct(&mut self.once_breaker_consecutive.clone(), n, |i| i).await
            }
            "once_breaker_keyed" => {
                let keys = self.keys;
                let request = |i: u64| Keyed {
                    key: keys[(i % keys.len() as u64) as usize],
                };
                direct(&mut self.once_breaker_keyed.clone(), n, request).await
            }
            "once_hedge" => direct(&mut self.once_hedge.clone(), n, |i| i).await,
            "once_hedge_percentile" => {
                direct(&mut self.once_hedge_percentile.clone(), n, |i| i).await
            }
            "tower_hedge" | "tower_hedge_unarmed" => {
                let cell = match case {
                    "tower_hedge" => &self.tower_hedge,
                    _ => &self.tower_hedge_unarmed,
                };
                let mut svc = cell.borrow_mut().take().expect("not in use");
                direct(&mut svc, n, |i| i).await;
                *cell.borrow_mut() = Some(svc);
            }
            _ => return false,
        }
        true
    }
}

/// `n` calls on `svc`, with a deadline (far enough never to matter) in scope.
async fn direct<S, R>(svc: &mut S, n: u64, request: impl Fn(u64) -> R)
where
    S: Service<R>,
    S::Error: std::fmt::Debug,
{
    tower_once::timeout::Deadline::after(Duration::from_secs(3600))
        .in_scope(async {
            for i in 0..n {
                let ready = svc.ready().await.expect("ready");
                ready.call(request(i)).await.expect("happy path");
            }
        })
        .await
}

/// Prints the heap bytes a keyed circuit holds, in each trip mode: 100 000 keys called once
/// each on one thread (a key called from more threads adds an entry to each thread's cache).
fn circuits(rt: &tokio::runtime::Runtime) {
    use tower_once::breaker::CircuitBreakerLayer;
    const N: usize = 100_000;
    let keys = keys(N);
    let _profiler = dhat::Profiler::builder().testing().build();
    rt.block_on(async {
        for (label, layer) in [
            ("failure ratio (the default)", CircuitBreakerLayer::new()),
            (
                "consecutive failures",
                CircuitBreakerLayer::new().consecutive_failures(5),
            ),
        ] {
            let mut svc = layer
                .key_by(key_of as KeyOf)
                .max_circuits(N + 1)
                .layer(Echo);
            // The layer's own structures, made with its first call.
            direct(&mut svc, 1, |_| Keyed { key: "warm" }).await;
            let before = dhat::HeapStats::get().curr_bytes;
            direct(&mut svc, N as u64, |i| Keyed {
                key: keys[i as usize],
            })
            .await;
            let after = dhat::HeapStats::get().curr_bytes;
            println!(
                "keyed circuit, {label}: {} B each ({N} circuits, keys of 13 bytes)",
                (after - before) / N
            );
        }
    });
}
