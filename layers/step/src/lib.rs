//! Durable steps for tower: an agent's tool call, or any call with a side effect, runs once
//! per step, and its result is stored and reused across retries, restarts and replicas.
//!
//! An agent loop that retries a step after a timeout sends the tool call again: a refund
//! whose first request was merely slow goes through twice. [`StepLayer`] wraps the tool's
//! `tower::Service`: each call is a [`Step`] with a [`StepId`] (run, step, tool, occurrence)
//! that comes from the caller's logic, so it is the same on every retry, after a restart and
//! in another process. The step's record lives in any
//! [`IdempotencyStore`](tower_once_idempotency::store::IdempotencyStore): memory, Redis,
//! Redis Cluster or Postgres.
//!
//! ```
//! use tower::{Layer, Service, ServiceExt};
//! use tower_once_core::classify::HttpClassifier;
//! use tower_once_idempotency::store::MemoryStore;
//! use tower_once_step::{Step, StepId, StepLayer};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # #[derive(serde::Serialize, serde::Deserialize)] struct Refund { status: u16 }
//! // The tool: POST /refunds. Its result is any serde type (JSON in the store).
//! let payments = tower::service_fn(|_req: http::Request<String>| async {
//!     Ok::<_, std::io::Error>(Refund { status: 201 })
//! });
//! let mut refunds = StepLayer::new(MemoryStore::new())
//!     .classify(|r: &Result<Refund, std::io::Error>| match r {
//!         Ok(r) if r.status < 300 => tower_once_core::classify::Action::Success,
//!         // Never stored as the tool's result: a 5xx may follow the effect, a 4xx refuses.
//!         Ok(r) if r.status >= 500 => tower_once_core::classify::Action::Retry { after: None },
//!         _ => tower_once_core::classify::Action::Stop,
//!     })
//!     .layer(payments);
//!
//! let body = r#"{"run":"run-3","amount":40}"#;
//! let request = http::Request::post("http://payments/refunds").body(body.to_string())?;
//! let step = Step::new(StepId::new("run-3", 2, "refund"), request)
//!     .arguments(body) // a repeat with other arguments is a mismatch, nothing sent
//!     .keyed(); // Idempotency-Key derived from the step: safe to send again
//! let refund = refunds.ready().await?.call(step).await?;
//! assert!(!refund.is_replayed());
//! # Ok(())
//! # }
//! ```
//!
//! # What a step does
//!
//! | the store has the step | the layer | returns |
//! |---|---|---|
//! | nothing (or an expired claim) | claims it, calls the inner service with the lease renewed every third of it; a success (by the classifier) is stored | [`StepOutput`], [`is_recorded`](StepOutput::is_recorded) |
//! | done, same arguments | nothing sent | the stored result, [`is_replayed`](StepOutput::is_replayed) |
//! | done or in progress, other arguments | nothing sent | [`StepError::is_mismatch`] |
//! | in progress elsewhere (task, process, replica) | waits (looks again, 10 ms doubling to a quarter of the lease) until it is done, its owner's lease ends, or the deadline | its result, [`waited`](StepOutput::waited); or [`StepError::is_in_progress`] at the deadline |
//! | an earlier attempt sent, never recorded | by the step's [`OnUnknown`] policy: [`RunAgain`](OnUnknown::RunAgain) calls again; [`Refuse`](OnUnknown::Refuse) asks the [`verify`](StepLayer::verify) hook: happened → its result recorded, nothing sent; not happened → calls; cannot tell (and without a hook) → sends nothing, records the outcome as unknown | the result ([`is_verified`](StepOutput::is_verified)); or [`StepError::is_unknown`], with the key and when it was sent |
//! | recorded as unknown | nothing sent | [`StepError::is_unknown`] again |
//! | store unreachable | nothing sent | [`StepError::is_store`] |
//!
//! And once the call returns:
//!
//! | the call | the record | returns |
//! |---|---|---|
//! | a success (by the classifier) | its result, through the [`Codec`] ([`Json`] by default), kept for the retention (7 days) | the result, recorded |
//! | a refusal (the classifier's `Action::Stop`: an upstream `4xx`), or any answer that is not a success with policy `RunAgain` | none: released; the step is not done | the answer, [`is_recorded`](StepOutput::is_recorded) `false` |
//! | an answer that may have had its effect (`Action::Retry` or `InProgress`: a `5xx`, a `429`), policy `Refuse` | asks the `verify` hook; without one: unknown, recorded (a gateway's `502` may follow the effect) | the verified result, or [`StepError::is_unknown`] |
//! | a success whose result cannot be kept (its codec fails, it is over [`result_limit`](StepLayer::result_limit), or the store fails) | none: released; an unkeyed call's sent mark stays, so its next attempt settles it as unknown | the result, [`is_recorded`](StepOutput::is_recorded) `false` |
//! | an error that says it was never sent (a refused connection) | none: released | [`StepError::is_inner`] |
//! | any other error (a timeout, a reset), policy `RunAgain` | none: released; the next attempt sends again, with the same key | [`StepError::is_inner`] |
//! | any other error, policy `Refuse` | asks the `verify` hook as above; without one: unknown, recorded | the verified result, or [`StepError::is_unknown`] with the error inside |
//! | the step's future dropped (a caller's timeout) | released, on a task of its own; an unkeyed call's sent mark stays, so the next attempt settles it as above | — |
//! | the process killed | the claim ends with its lease; an unkeyed call's mark stays, so the next owner settles it (the `verify` hook, or unknown) | — |
//!
//! # Unknown outcomes
//!
//! A call that timed out may have had its effect. The safe way to send it again is with a key
//! the downstream honours: [`Step::keyed`] stamps [`Step::idempotency_key`] (`step-` and 32
//! hex digits, derived from the step and its scope, the same in every process; or the
//! request's own non-empty `Idempotency-Key`) as `Idempotency-Key`, and the step's policy
//! becomes [`OnUnknown::RunAgain`]. Without a key, a request that is not
//! idempotent gets [`OnUnknown::Refuse`]: before it is sent, the step writes a "sent" mark in
//! the store (one more round trip), and any later attempt that finds the mark without a
//! result records the step as unknown and never sends it. A [`verify`](StepLayer::verify)
//! hook can ask the downstream first (was the note with this run's text created?): what it
//! finds is recorded as the step's result. Otherwise the caller decides: ask a person, or look
//! the effect up downstream with the key and time the error carries.
//!
//! # Effects in Postgres
//!
//! On a transactional `PostgresStore` (feature `postgres`), the step's claim is a transaction
//! holding the step's lock, handed to the tool: an `http::Request`'s extensions carry a
//! `tower_once_step::postgres::StepClaim`. The tool writes its effect on that transaction and
//! commits it with the step's result (`StepClaim::commit`, by the layer's classifier, codec and
//! result limit), one commit.
//! A failure or a crash before it leaves neither, and the step runs again at once.
//!
//! # Run once per message
//!
//! [`run_once::RunOnceLayer`] is this mechanism with a message's identity instead of a step's:
//! a job from a queue, an event, a webhook, delivered at least once, runs its handler once
//! per id (any type that implements [`run_once::Delivery`]). A done id is a duplicate, and so
//! is another entry with an id that is running; the same entry running elsewhere is not
//! waited for (an error: the queue delivers it again); a failure frees the id. The worker of `tower-once-worker` runs its jobs with it.
//!
//! # Costs
//!
//! A replay is one store round trip and a decode; a fresh keyed step two (claim, record); a
//! fresh unkeyed one three (claim, mark, record). An unkeyed step's sent mark stays for the
//! retention (renewed while its call runs), an in-progress claim that the memory store never
//! drops to make room, so that a step whose record a full store dropped is still never sent
//! blindly again: size the memory store's `max_entries` for the unkeyed steps of a retention
//! (or shorten it). A Redis with an eviction policy other than `noeviction` can drop marks
//! under memory pressure (see Known limits).
//!
//! # Compared with durable-execution engines
//!
//! | | this layer | Restate `ctx.run` | DBOS steps | Temporal activities |
//! |---|---|---|---|---|
//! | what is stored | a step's successful result, under (run, step, tool, occurrence) | the journal of a handler's every action | each step's output, keyed by workflow id and position | the activity's result in the workflow history |
//! | where | your Redis, Postgres, or memory | the Restate server's log | your Postgres | the Temporal cluster |
//! | a crash between the effect and the record | keyed: sent again with the same key; unkeyed: reported unknown, never sent twice | the action runs again | the step runs again (a transaction step records in its own transaction) | the activity runs again |
//! | a changed call on replay | mismatch error, nothing sent | journal mismatch error | — | non-determinism error |
//! | what you run | a tower layer in your process | a server | a library and Postgres | a cluster and workers |
//!
//! # Tracing and metrics
//!
//! Each step runs in a `step` span with `step.run`, `step.position`, `step.tool`,
//! `step.occurrence` and, at its end, `step.outcome` (`called`, `replayed`, `unknown`,
//! `mismatch`, `in_progress`, `failed`; a result the verify hook found counts as `called`). With the `metrics` feature:
//! `tower_once_step_steps_total{outcome}` and `tower_once_step_waits_total` (steps that
//! waited for another owner).
//!
//! # Known limits
//!
//! - A step changed from unkeyed to [`keyed`](Step::keyed) while runs are in flight: a call
//!   the old code sent and never recorded is sent again under the new key (a keyed step does
//!   not look for an unkeyed attempt's sent mark, which would cost every fresh keyed step a
//!   round trip). Deploy such a change with no run in flight, or keep the old policy.
//! - A step's retention is a store's to keep: a store that drops records to make room (the
//!   memory store at its bounds, a Redis with an eviction policy) can drop a done step's
//!   result; a keyed step then runs again with its key, and an unkeyed one is settled unknown
//!   from its sent mark, except on a Redis whose eviction policy drops the mark too: run the
//!   steps' Redis with `maxmemory-policy noeviction` (a full Redis then refuses writes, and
//!   steps fail closed).
//! - The arguments' fingerprint is xxh3-128, fast and not collision-resistant: arguments
//!   crafted to collide with an earlier call of the same step (same run, position and tool)
//!   get that call's result instead of a mismatch. Nothing runs twice.
//! - On the memory and Redis stores (and the plain Postgres store) the result is a write after
//!   the call: a crash between the two runs a keyed step again (with its key) or reports an
//!   unkeyed one unknown. A tool whose effect is in Postgres closes that window on a
//!   transactional store: see [`postgres`] (feature `postgres`).

mod call;
mod codec;
mod config;
mod engine;
mod error;
mod future;
mod handoff;
mod held;
mod id;
mod layer;
mod metrics;
mod output;
mod pending;
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub mod postgres;
mod record;
pub mod run_once;
mod service;
mod settle;
mod verify;

pub use self::call::{OnUnknown, Step, StepRequest};
pub use self::codec::{Codec, Json};
pub use self::config::{DEFAULT_LEASE, DEFAULT_MAX_WAIT, DEFAULT_RESULT_LIMIT, DEFAULT_RETENTION};
pub use self::error::StepError;
pub use self::future::ResponseFuture;
pub use self::id::{StepId, MAX_ID_LEN};
pub use self::layer::StepLayer;
pub use self::output::StepOutput;
pub use self::service::Steps;
pub use self::verify::{Verified, Verify};
