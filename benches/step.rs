//! A replayed durable step on the memory store beside what it cannot avoid: a `HashMap` lookup
//! of the stored result plus decoding it (`map_decode`). Counted, not timed: heap allocations
//! per step (a counting allocator, `dhat` in testing mode) and, under callgrind, instructions.
//! A fresh step (`step_fresh`: claim, call, record) is counted too.
//!
//! ```sh
//! cargo bench --bench step                                   # allocations per step
//! cargo bench --bench step -- time                           # ns per step, interleaved rounds
//! BENCH=step bash benches/callgrind.sh 2000 map_decode step_replay step_fresh  # instructions
//! ```

#![allow(missing_docs)]

#[path = "support/report.rs"]
mod report;

use report::{median, median_ratio, Table};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::time::Instant;
use tower::{Layer, Service, ServiceExt};
use tower_once::idempotency::store::MemoryStore;
use tower_once::step::{Step, StepId, StepLayer, StepRequest};

#[global_allocator]
static ALLOC: dhat::Alloc = dhat::Alloc;

const CASES: [&str; 3] = ["map_decode", "step_replay", "step_fresh"];

/// A tool's result of a typical size: a status and a short JSON answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct ToolResult {
    status: u16,
    body: String,
}

fn result() -> ToolResult {
    ToolResult {
        status: 201,
        body: r#"{"refund":"re_1","run":"run-3","amount":40}"#.to_owned(),
    }
}

struct Call;

impl StepRequest for Call {}

type Steps = tower_once::step::Steps<
    tower::util::ServiceFn<fn(Call) -> std::future::Ready<Result<ToolResult, std::io::Error>>>,
    MemoryStore,
>;

fn tool(_: Call) -> std::future::Ready<Result<ToolResult, std::io::Error>> {
    std::future::ready(Ok(result()))
}

struct Cases {
    map: HashMap<String, Vec<u8>>,
    steps: Steps,
    /// Fresh steps go to a store of their own, replaced every 4 096 steps: a memory store that
    /// fills up makes room by dropping records, the replayed one among them.
    fresh_steps: Steps,
    fresh: u64,
}

fn steps() -> Steps {
    StepLayer::new(MemoryStore::new()).layer(tower::service_fn(tool as fn(Call) -> _))
}

impl Cases {
    async fn new() -> Self {
        let mut map = HashMap::new();
        map.insert(
            "run-3/2/refund".to_owned(),
            serde_json::to_vec(&result()).expect("serializes"),
        );
        let mut cases = Self {
            map,
            steps: steps(),
            fresh_steps: steps(),
            fresh: 0,
        };
        let replayed = Self::step(&mut cases.steps, "run-3".to_owned()).await;
        assert!(!replayed, "recorded, for the replays");
        cases
    }

    async fn step(steps: &mut Steps, run: String) -> bool {
        let step = Step::new(StepId::new(run, 2, "refund"), Call).arguments("40");
        let ready = steps.ready().await.expect("ready");
        ready.call(step).await.expect("a step").is_replayed()
    }

    async fn run(&mut self, case: &str, n: u64) {
        for _ in 0..n {
            match case {
                "map_decode" => {
                    let stored = self.map.get("run-3/2/refund").expect("stored");
                    let value: ToolResult = serde_json::from_slice(stored).expect("decodes");
                    assert_eq!(value.status, 201);
                }
                "step_replay" => assert!(Self::step(&mut self.steps, "run-3".to_owned()).await),
                "step_fresh" => {
                    self.fresh += 1;
                    if self.fresh.is_multiple_of(4096) {
                        self.fresh_steps = steps();
                    }
                    let run = format!("fresh-{}", self.fresh);
                    assert!(!Self::step(&mut self.fresh_steps, run).await)
                }
                other => panic!("unknown case {other}; one of {CASES:?}"),
            }
        }
    }
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
    let mut cases = rt.block_on(Cases::new());
    rt.block_on(async {
        for case in CASES {
            cases.run(case, 2).await;
        }
    });
    if let [mode] = args.as_slice() {
        assert_eq!(mode, "time", "usage: time | CASE N");
        return time(&rt, &mut cases);
    }
    if let [case, n] = args.as_slice() {
        // One case, uncounted: for callgrind (benches/callgrind.sh).
        let n = n.parse().expect("a request count");
        rt.block_on(cases.run(case, n));
        return;
    }
    const N: u64 = 1000;
    let table = Table::new(&["case", "allocs/step", "bytes/step"]);
    for case in CASES {
        let _profiler = dhat::Profiler::builder().testing().build();
        let before = dhat::HeapStats::get();
        rt.block_on(cases.run(case, N));
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

/// Nanoseconds per step of each case, in interleaved rounds (a noisy moment slows every case
/// of its round alike), and each case's median ratio to `map_decode` over the rounds.
fn time(rt: &tokio::runtime::Runtime, cases: &mut Cases) {
    const ROUNDS: usize = 15;
    const N: u64 = 20_000;
    let mut ns: Vec<Vec<f64>> = vec![Vec::new(); CASES.len()];
    for _ in 0..ROUNDS {
        for (i, case) in CASES.iter().enumerate() {
            let start = Instant::now();
            rt.block_on(cases.run(case, N));
            ns[i].push(start.elapsed().as_nanos() as f64 / N as f64);
        }
    }
    let table = Table::new(&["case", "ns/step (median)", "ratio to map_decode"]);
    for (i, case) in CASES.iter().enumerate() {
        table.row(&[
            case.to_string(),
            format!("{:.0}", median(ns[i].iter().copied())),
            format!("{:.2}", median_ratio(&ns[i], &ns[0])),
        ]);
    }
}
