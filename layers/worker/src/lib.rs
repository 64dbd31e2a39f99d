//! A Redis Streams worker for tower: each stream entry becomes a [`Job`] handed to any
//! `tower::Service<Job>`, delivered at least once, redelivered after crashes, dead-lettered
//! when no delivery can succeed, and run once per job id with [`RunOnceLayer`].
//!
//! Because the handler is a service, the same layers that guard an HTTP client guard a job: a
//! `RetryLayer` absorbs seconds-long blips inside one delivery, a `TimeoutLayer` caps each
//! attempt by what is left of the delivery's [`Deadline`](tower_once_timeout::Deadline),
//! redelivery absorbs crashes, and the dead-letter stream takes what no retry can fix. It
//! needs Redis 7.0 or newer, one server or a Cluster.
//!
//! # Example
//!
//! ```no_run
//! use std::time::Duration;
//! use tower::ServiceBuilder;
//! use tower_once_idempotency::store::MemoryStore;
//! use tower_once_retry::RetryLayer;
//! use tower_once_worker::{classify::JobClassifier, Job, JobError, RunOnceLayer, Worker, WorkerConfig};
//!
//! # mod tower_once { pub async fn shutdown_signal() {} }
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let handler = ServiceBuilder::new()
//!     // A lease at most half of `claim_idle`, so a crashed worker's claim is gone first.
//!     .layer(RunOnceLayer::new(MemoryStore::new()).lease(Duration::from_secs(15)))
//!     .layer(RetryLayer::new().classify(JobClassifier).max_attempts(4))
//!     .service_fn(|job: Job| async move {
//!         println!("sending mail for {}", job.job_id());
//!         Ok::<_, JobError>(())
//!     });
//! let config = WorkerConfig::new("{jobs}", "mailers").claim_idle(Duration::from_secs(30));
//! let worker = Worker::connect("redis://127.0.0.1:6379", config, handler)?;
//! // SIGTERM or SIGINT (`shutdown_signal` is in the `tower-once` crate, feature `signal`).
//! let report = worker.run(tower_once::shutdown_signal()).await;
//! println!("{report:?}");
//! # Ok(())
//! # }
//! ```
//!
//! Jobs are added by [`Producer::enqueue`] (with `job_id`, `payload`, `enqueued_at`), or by
//! anyone with `XADD <stream> * job_id <id> payload <bytes>`. [`JobId::from_scoped_key`]
//! derives a job id from an idempotency record (uuid v5), so a retried request enqueues the
//! same job id; [`Producer::trim_acknowledged`] trims with `MINID` below every group's oldest
//! pending or undelivered entry, never a pending one. The repository's `examples/worker.rs` is a
//! worker process to try (its options and the `redis-cli` lines that feed it are in
//! `examples/README.md`).
//!
//! # Semantics
//!
//! | delivery | Redis action |
//! |---|---|
//! | before any fetch | the handler service is asked for readiness, once per entry to fetch: a handler that is not ready (a circuit breaker gating on an open circuit, a concurrency limit) holds the fetch back, so no job is taken that could not run; one whose readiness fails has nothing fetched (the worker backs off, 100 ms doubling to 5 s, and asks again) |
//! | an entry fetched for a handler no longer ready when the read returns (a circuit that opened while `XREADGROUP` blocked) | given back unrun: `XCLAIM ... IDLE <claim_idle> RETRYCOUNT <count - 1> JUSTID`, its delivery count restored |
//! | new entry | `XREADGROUP GROUP <g> <me> COUNT <ready slots> BLOCK <ms> STREAMS <s> >` (delivery count 1) |
//! | entry idle > `claim_idle` in any consumer (crashed, or left pending) | `XAUTOCLAIM` (cursor kept between calls), delivery counts from one `XPENDING` per batch (plus one per entry a long pending list pushed out of its reply) |
//! | delivery count > `max_deliveries` | dead-lettered (`reason` `max_deliveries`), handler not called |
//! | no valid `job_id` field | dead-lettered (`reason` `malformed`), handler not called |
//! | handler running | `XCLAIM <s> <g> <me> 0 <id> JUSTID` every `claim_idle / 3` for entries still ours (one script call for all) |
//! | `Ok` (classified `Success`) | `XACK`, batched with other finished jobs |
//! | `Err` classified `Retry` (default: any error not marked permanent), or the job deadline passes | nothing: stays pending, redelivered after `claim_idle` |
//! | `Err` classified `Retry { after: Some(d) }` ([`JobError::redeliver_after`]; a circuit breaker's refusal, with the time until its probe) | `XCLAIM ... IDLE <claim_idle - d> JUSTID` (while still ours): redelivered after about `d`, at most `claim_idle` |
//! | `Err` classified `Stop` ([`JobError::permanent`]) | `MULTI; XADD <s>:dead ...; XACK; EXEC` (`reason` `permanent`) |
//! | shutdown | stop reading (a read in progress finishes, within `BLOCK`); in-flight jobs finish within the grace period and are acknowledged; the rest stay pending |
//! | Redis unreachable | back off (100 ms doubling to 5 s; a warning on the 1st, 2nd, 4th, 8th... failure in a row), reconnect, recreate the group if it was lost |
//!
//! A dependency's outage should not spend deliveries: put a circuit breaker with
//! `gate_readiness(true)` (`tower_once::breaker`) in the handler, and while its circuit is
//! open the worker fetches nothing; only its probes are delivered, one at a time, so an outage
//! far longer than `max_deliveries × claim_idle` dead-letters nothing. The repository's
//! `layers/worker/tests/dependency_outage.rs`: a 10 s outage with `max_deliveries` 3 and a 2 s
//! job deadline dead-letters none of five jobs and runs each once it ends; without the breaker,
//! all five are dead-lettered.
//!
//! The recommended handler stack, outermost first: the gating breaker, a retry inside the
//! delivery, a timeout per attempt, the job. Every error on the way keeps its
//! [`Permanence`](classify::Permanence) (a timeout is transient; the job's own error decides
//! otherwise), so [`JobClassifier`](classify::JobClassifier) reads it through the layers:
//!
//! ```no_run
//! use std::time::Duration;
//! use tower::ServiceBuilder;
//! use tower_once_breaker::CircuitBreakerLayer;
//! use tower_once_retry::RetryLayer;
//! use tower_once_timeout::TimeoutLayer;
//! use tower_once_worker::{classify::JobClassifier, Job, JobError, Worker, WorkerConfig};
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let handler = ServiceBuilder::new()
//!     .layer(CircuitBreakerLayer::new().gate_readiness(true))
//!     .layer(RetryLayer::new().classify(JobClassifier).max_attempts(3))
//!     .layer(TimeoutLayer::new(Duration::from_secs(2)))
//!     .service_fn(|job: Job| async move {
//!         println!("sending mail for {}", job.job_id());
//!         Ok::<_, JobError>(())
//!     });
//! let config = WorkerConfig::new("{jobs}", "mailers");
//! let worker = Worker::connect("redis://127.0.0.1:6379", config, handler)?;
//! let report = worker.run(std::future::pending::<()>()).await;
//! # let _ = report;
//! # Ok(())
//! # }
//! ```
//!
//! Delivery counts come from Redis, not memory, so they survive crashes. Dead letters carry
//! `job_id`, `payload`, `reason`, `deliveries`, `stream_id`, `error`, `consumer`, `dead_at`
//! ([`dead_letter`]); [`DeadLetters::list`](dead_letter::DeadLetters::list) and
//! [`DeadLetters::requeue`](dead_letter::DeadLetters::requeue) let a person look at them and send
//! them back. On Redis Cluster, give the stream a hash tag (`{jobs}`) so `{jobs}:dead` shares
//! its slot and dead-lettering stays one transaction; without a tag the cluster refuses the
//! `MULTI` and the worker falls back to `XADD` then `XACK` (a crash in between gives a duplicate
//! dead letter, never a lost job).
//!
//! Throughput costs per job, amortised: one `XREADGROUP` per batch, one `XACK` per batch of
//! finished jobs; `XAUTOCLAIM` every `claim_idle / 2` (plus one `XPENDING` when it found
//! something); the refresh every `claim_idle / 3` while jobs run.
//!
//! # Compared with a plain (Sidekiq-style) worker
//!
//! | | a plain `XREADGROUP`/`XACK` loop, or Sidekiq | this worker |
//! |---|---|---|
//! | handler | a function | a `tower::Service<Job>`: retry, timeout and run-once layers compose |
//! | crash mid-job | the entry sits in a dead consumer's pending list until someone reclaims it by hand (Sidekiq OSS loses it) | taken over after `claim_idle` with its delivery count + 1 |
//! | slow job vs `claim_idle` | `claim_idle` must exceed the slowest job, or it runs twice | the live worker refreshes its claim; only dead workers lose jobs |
//! | retry counts | kept in memory or in the payload | Redis's delivery count, which survives crashes |
//! | poison messages | retried forever, or dropped | dead-lettered after `max_deliveries`, or at once when permanent; listed and requeued with [`DeadLetters`](dead_letter::DeadLetters) |
//! | duplicate delivery / enqueue | effect runs twice | [`RunOnceLayer`]: once per job id |
//! | backpressure | read everything, queue in memory | never reads more than free slots |
//! | per-delivery deadline | none | a [`Deadline`](tower_once_timeout::Deadline) in scope for every poll of the handler, and on the job |
//!
//! # Known limits
//!
//! - A delivery whose `XREADGROUP` reply was lost (a timeout) still counts toward
//!   `max_deliveries`: a failing job may run one time fewer before it is dead-lettered.
//! - A Redis frozen for longer than `claim_idle` can, when it resumes, let another worker take
//!   over a job that is still running (its idle time and the run-once lease kept running during
//!   the freeze): with run-once on Redis the effect may then happen twice. A handler that
//!   completes its run-once record in its own Postgres transaction
//!   ([`RunOnceLayer`] on the Postgres store) finds its claim lost when it resumes and rolls
//!   back instead.
//! - On the memory or Redis store, run-once cannot cover a crash between the effect and its
//!   "done" record (the job runs again once the claim's lease expires); on the Postgres store
//!   the handler commits that record in the transaction of its effects
//!   (`Claim::complete_in`, feature `postgres` of `tower-once-idempotency`, as the pipeline
//!   example's worker does), which closes the window for effects in that database.
//! - A `Retry`'s `after` (a server's `Retry-After`, given with [`JobError::redeliver_after`])
//!   holds the next delivery back by at most `claim_idle` (a stream cannot delay one entry
//!   longer; longer delays are cut to it); a delay shorter than `block` (default 2 s) may wait
//!   for the read already in progress; and it assumes every consumer of the group uses the same
//!   `claim_idle` (one with a shorter `claim_idle` sees the held-back entry as claimable
//!   sooner).
//! - The group-lag gauge is per worker process (each reports the same group's lag).
//!
//! The first two are kept as ignored tests in the repository (`layers/worker/tests/delivery.rs`,
//! `tests/worker_processes.rs`).
//!
//! # Feature flags
//!
//! | feature | enables |
//! |---|---|
//! | `metrics` | counters `tower_once_worker_processed_total`, `tower_once_worker_failed_total`, `tower_once_worker_redelivered_total`, `tower_once_worker_dead_lettered_total{reason}` and the gauges `tower_once_worker_in_flight` and `tower_once_worker_group_lag` (`XINFO GROUPS` `lag`), through the `metrics` facade |
//!
//! # Minimum supported Rust version
//!
//! 1.88. Raising it is a minor-version change.

// Library code never unwraps: a panic on input is a bug (tests may).
// Feature-gated items show their feature on docs.rs.
#![cfg_attr(docsrs, feature(doc_cfg))]
// Library code never unwraps: a panic on input is a bug (tests may).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod classify;
pub mod config;
mod consume;
pub mod dead_letter;
mod error;
mod fetch;
mod job;
mod metrics;
mod producer;
mod report;
mod run_loop;
pub mod run_once;
mod streams;
mod worker;

pub use self::config::{default_consumer_name, ConfigError, WorkerConfig};
pub use self::error::{BoxError, JobError, WorkerError};
pub use self::job::{Job, JobId, JOB_ID_NAMESPACE};
pub use self::metrics::JobOutcome;
pub use self::producer::Producer;
pub use self::report::RunReport;
pub use self::run_once::{RunOnceLayer, RunOnceOutcome};
pub use self::worker::Worker;

/// The `redis` client this crate is built on, to make connections of the matching version.
pub use ::redis;
