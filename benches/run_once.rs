//! The worker's `RunOnceLayer` on the memory store, beside the bare handler: what running a
//! job once per id costs besides its store's round trips. Counted, not timed: heap
//! allocations per job (a counting allocator, `dhat` in testing mode) and, under callgrind,
//! instructions. `fresh` runs a new job id each time (claim, run, record); `duplicate` the
//! same job id again (claim finds it done; the handler does not run).
//!
//! ```sh
//! cargo bench --bench run_once --features worker                   # allocations per job
//! BENCH=run_once FEATURES=worker bash benches/callgrind.sh 2000 bare fresh duplicate  # instructions
//! ```

#![allow(missing_docs)]

#[path = "support/report.rs"]
mod report;

use report::Table;
use tower::{Layer, Service, ServiceExt};
use tower_once::idempotency::store::MemoryStore;
use tower_once::worker::{Job, JobError, JobId, RunOnceLayer};

#[global_allocator]
static ALLOC: dhat::Alloc = dhat::Alloc;

const CASES: [&str; 3] = ["bare", "fresh", "duplicate"];

type Handler = tower::util::ServiceFn<fn(Job) -> std::future::Ready<Result<(), JobError>>>;

fn handle(_: Job) -> std::future::Ready<Result<(), JobError>> {
    std::future::ready(Ok(()))
}

fn handler() -> Handler {
    tower::service_fn(handle as fn(Job) -> _)
}

type RunOnce = <RunOnceLayer<MemoryStore> as Layer<Handler>>::Service;

struct Cases {
    bare: Handler,
    done: RunOnce,
    /// Fresh job ids go to a store of their own, replaced every 4 096 jobs: a memory store
    /// that fills up makes room by dropping records.
    fresh: RunOnce,
    count: u64,
    ids: Vec<JobId>,
}

fn run_once() -> RunOnce {
    RunOnceLayer::new(MemoryStore::new()).layer(handler())
}

fn job(id: &JobId) -> Job {
    Job::new("1-0", id.clone(), "{}", 1)
}

impl Cases {
    async fn new() -> Self {
        let ids = (0..4096)
            .map(|i| JobId::new(format!("welcome-mail-{i}")).expect("a job id"))
            .collect();
        let mut cases = Self {
            bare: handler(),
            done: run_once(),
            fresh: run_once(),
            count: 0,
            ids,
        };
        let id = JobId::new("done-1").expect("a job id");
        let first = cases
            .done
            .ready()
            .await
            .expect("ready")
            .call(job(&id))
            .await;
        assert!(!first.expect("runs").is_duplicate());
        cases
    }

    async fn run(&mut self, case: &str, n: u64) {
        let done = JobId::new("done-1").expect("a job id");
        for _ in 0..n {
            match case {
                "bare" => {
                    let ready = self.bare.ready().await.expect("ready");
                    ready.call(job(&done)).await.expect("runs");
                }
                "duplicate" => {
                    let ready = self.done.ready().await.expect("ready");
                    assert!(ready.call(job(&done)).await.expect("runs").is_duplicate());
                }
                "fresh" => {
                    let i = (self.count % 4096) as usize;
                    self.count += 1;
                    if i == 0 {
                        self.fresh = run_once();
                    }
                    let ready = self.fresh.ready().await.expect("ready");
                    let job = job(&self.ids[i]);
                    assert!(!ready.call(job).await.expect("runs").is_duplicate());
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
    if let [case, n] = args.as_slice() {
        // One case, uncounted: for callgrind (benches/callgrind.sh).
        let n = n.parse().expect("a job count");
        rt.block_on(cases.run(case, n));
        return;
    }
    const N: u64 = 1000;
    let table = Table::new(&["case", "allocs/job", "bytes/job"]);
    for case in CASES {
        rt.block_on(cases.run(case, 2));
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
