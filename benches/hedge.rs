//! Hedging when no hedge fires: the inner service answers at once, so each row is the layer's
//! own cost on every request (planning a hedge, its timer, recording the latency). tower-once's
//! `HedgeLayer` beside `tower::hedge::Hedge`, over the same inner service, every call with a
//! `Deadline` in scope, one task on a current-thread runtime.
//!
//! The two layers decide the delay differently, so the rows pair them by what they do per call:
//!
//! - **armed** (a delay is known, so every call plans a hedge and makes its timer, which is
//!   never polled because the first attempt answers first): `HedgeLayer::new(100 ms)`, a fixed
//!   delay, against tower's `Hedge` with a histogram pre-filled with 1..=100 ms
//!   (`new_with_mock_latencies`, 90th percentile: a 90 ms delay; a period of an hour, so it
//!   never rotates during the bench);
//! - **not armed** (no delay known yet: too few latencies observed, so nothing is planned and
//!   each call only records its latency): `HedgeLayer::latency_percentile(0.9, u64::MAX, 10 s)`
//!   against tower's `Hedge::new(.., u64::MAX, 0.9, 10 s)`, where `u64::MAX` data points keeps
//!   both unarmed however long the bench runs.
//!
//! Rows are interleaved (each round runs every row once) and summarised with
//! `support/report.rs`: medians of the rounds, ratios the medians of the per-round ratios.
//! Allocations and instructions per call are counted by `cost.rs` and `callgrind.sh`.
//!
//! ```sh
//! cargo bench --bench hedge
//! ```
//!
//! Settings: `CALLS` (calls per row and round, default 1 000 000), `ROUNDS` (default 7).
//! `ONLY=once` (or `tower`, `once_percentile`, `tower_unarmed`, `bare`) runs one row alone,
//! for a profiler.

#[path = "support/echo.rs"]
mod echo;
#[allow(dead_code)] // `seconds` is not used here
#[path = "support/env.rs"]
mod env;
#[path = "support/report.rs"]
mod report;

use echo::Echo;
use report::{median, median_ratio, Table};
use std::fmt::Debug;
use std::time::{Duration, Instant};
use tokio::runtime::Runtime;
use tower::{Layer, Service, ServiceExt};
use tower_once::hedge::HedgeLayer;
use tower_once::timeout::Deadline;

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

/// Nanoseconds per call: `calls` calls, one after the other, on one task of `rt`, with a
/// deadline (far enough never to matter) in scope.
fn ns_per_call<S>(rt: &Runtime, svc: &mut S, calls: u64) -> f64
where
    S: Service<u64, Response = u64>,
    S::Error: Debug,
{
    rt.block_on(
        Deadline::after(Duration::from_secs(3600)).in_scope(async move {
            let started = Instant::now();
            for i in 0..calls {
                let out = svc.ready().await.expect("ready").call(i).await;
                assert_eq!(out.expect("the happy path"), i);
            }
            started.elapsed().as_nanos() as f64 / calls as f64
        }),
    )
}

const ROWS: [&str; 5] = [
    "bare service",
    "tower-once `HedgeLayer::new(100 ms)` (armed)",
    "`tower::hedge::Hedge`, 90th percentile of 1..=100 ms pre-filled (armed)",
    "tower-once `HedgeLayer::latency_percentile(0.9, u64::MAX, 10 s)` (not armed)",
    "`tower::hedge::Hedge::new(.., u64::MAX, 0.9, 10 s)` (not armed)",
];
/// For each row, the row it is compared with.
const PEERS: [usize; 5] = [2, 2, 2, 4, 4];

fn main() {
    let calls: u64 = env::var("CALLS", 1_000_000, 1..=u64::MAX);
    let rounds: usize = env::var("ROUNDS", 7, 1..=1000);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    // Built inside the runtime: tokio's clock and timers are read from there.
    let (mut once, mut tower_armed, mut once_percentile, mut tower_unarmed) = rt.block_on(async {
        let latencies: Vec<u64> = (1..=100).collect();
        (
            HedgeLayer::new(Duration::from_millis(100)).layer(Echo),
            tower::hedge::Hedge::new_with_mock_latencies(
                Echo,
                HedgeAll,
                10,
                0.9,
                Duration::from_secs(3600),
                &latencies,
            ),
            HedgeLayer::latency_percentile(0.9, u64::MAX, Duration::from_secs(10)).layer(Echo),
            tower::hedge::Hedge::new(Echo, HedgeAll, u64::MAX, 0.9, Duration::from_secs(10)),
        )
    });
    if let Ok(only) = std::env::var("ONLY") {
        let ns = match only.as_str() {
            "bare" => ns_per_call(&rt, &mut Echo, calls),
            "once" => ns_per_call(&rt, &mut once, calls),
            "tower" => ns_per_call(&rt, &mut tower_armed, calls),
            "once_percentile" => ns_per_call(&rt, &mut once_percentile, calls),
            "tower_unarmed" => ns_per_call(&rt, &mut tower_unarmed, calls),
            other => panic!(
                "ONLY is one of bare, once, tower, once_percentile, tower_unarmed; not {other}"
            ),
        };
        println!("{only}: {ns:.1} ns per call");
        return;
    }
    let mut bare = Echo;
    let mut round = |calls: u64| {
        [
            ns_per_call(&rt, &mut bare, calls),
            ns_per_call(&rt, &mut once, calls),
            ns_per_call(&rt, &mut tower_armed, calls),
            ns_per_call(&rt, &mut once_percentile, calls),
            ns_per_call(&rt, &mut tower_unarmed, calls),
        ]
    };
    println!("ns per call, {calls} calls per row and round, median of {rounds} interleaved rounds");
    println!();
    round(10_000); // warm every row
    let mut ns: [Vec<f64>; 5] = Default::default();
    for _ in 0..rounds {
        for (row, value) in ns.iter_mut().zip(round(calls)) {
            row.push(value);
        }
    }
    let table = Table::new(&["row", "ns per call", "over bare", "ratio to its tower peer"]);
    let bare = median(ns[0].iter().copied());
    for (i, name) in ROWS.into_iter().enumerate() {
        let m = median(ns[i].iter().copied());
        table.row(&[
            name.to_owned(),
            format!("{m:.1}"),
            format!("{:.1}", m - bare),
            format!("{:.3}", median_ratio(&ns[i], &ns[PEERS[i]])),
        ]);
    }
}
