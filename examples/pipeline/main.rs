//! The whole pipeline, one binary with a role per process, so that each can be killed alone:
//!
//! ```text
//! client ──POST /v1/summaries──▶ api ──XADD jobs:summaries──▶ worker ──HTTP──▶ model
//!          (Idempotency-Key,     (IdempotencyLayer,            (RetryLayer + TimeoutLayer)
//!           X-Tenant-Id)          Redis store)                   │
//!                                                                ▼ one transaction
//!                                                 Postgres: summaries + outbox
//!                                                                │
//!                                    mailer ◀──POST, Idempotency-Key── relay
//!                                    (IdempotencyLayer)
//! ```
//!
//! ```sh
//! cargo run --example pipeline --features worker,outbox,postgres -- all \
//!     --redis redis://127.0.0.1:6379 --postgres postgres://postgres@127.0.0.1:5432/test
//! curl -si localhost:3000/v1/summaries -H 'Idempotency-Key: k1' -H 'X-Tenant-Id: acme' \
//!     -H 'content-type: application/json' -d '{"text":"hello world","notify":"a@example.com"}'
//! curl -s localhost:3000/v1/summaries/<job_id>; curl -s localhost:3002/emails
//! ```
//!
//! `pipeline <role> --redis URL --postgres URL [--addr ADDR] [--model URL] [--mailer URL]
//! [--claim-idle-ms N] [--max-deliveries N]`, role one of `api`, `worker`, `relay`, `model`,
//! `mailer`, `all` (everything in one process: api on `--addr` (default 127.0.0.1:3000), the
//! model on the next port, the mailer on the one after). Each role runs until SIGTERM or
//! SIGINT, shuts down gracefully and creates the tables it needs on start. `--claim-idle-ms`
//! is the worker's `claim_idle` and the relay's lease. More options for tests and tuning:
//! `--model-timeout-ms 5000` (one model call), `--job-deadline-ms 12000` (one delivery),
//! `--poll-ms 1000` (the relay's poll), `--linger-ms 0` (worker: after committing, before
//! `XACK`; relay: after the mailer answered, before recording it — the windows a crash test
//! kills a process in).

mod api;
mod args;
mod db;
mod mailer;
mod model;
mod relay;
mod worker;

use args::{Args, Role};
use tower_once::worker::BoxError;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,tower_once_worker=debug,tower_once_outbox=debug".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = match Args::parse(std::env::args().skip(1)) {
        Ok(args) => args,
        Err(message) => {
            eprintln!("{message}\n{}", args::USAGE);
            return std::process::ExitCode::from(2);
        }
    };
    match run(args).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<(), BoxError> {
    // SIGTERM or SIGINT, installed before any role says it is up.
    let shutdown = tower_once::shutdown_signal();
    match args.role {
        Role::Api => api::serve(&args, args.addr, shutdown).await,
        Role::Worker => worker::run(&args, shutdown).await,
        Role::Relay => relay::run(&args, shutdown).await,
        Role::Model => model::serve(args.addr, shutdown).await,
        Role::Mailer => mailer::serve(args.addr, shutdown).await,
        Role::All => all(args, shutdown).await,
    }
}

/// Every role in one process, on consecutive ports.
async fn all(mut args: Args, shutdown: tower_once::ShutdownSignal) -> Result<(), BoxError> {
    let api_addr = args.addr;
    let model_addr = args::next_port(api_addr, 1)?;
    let mailer_addr = args::next_port(api_addr, 2)?;
    args.model = format!("http://{model_addr}");
    args.mailer = format!("http://{mailer_addr}");
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let wait = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };
    // Joined, not spawned: every role runs on this task's runtime until its own shutdown.
    let roles = async {
        tokio::join!(
            model::serve(model_addr, wait(stopped.clone())),
            mailer::serve(mailer_addr, wait(stopped.clone())),
            api::serve(&args, api_addr, wait(stopped.clone())),
            worker::run(&args, wait(stopped.clone())),
            relay::run(&args, wait(stopped.clone())),
        )
    };
    tracing::info!(%api_addr, %model_addr, %mailer_addr, "pipeline running");
    let stop_on_signal = async {
        shutdown.await;
        let _ = stop.send(true);
    };
    let ((model, mailer, api, worker, relay), ()) = tokio::join!(roles, stop_on_signal);
    model?;
    mailer?;
    api?;
    worker?;
    relay
}
