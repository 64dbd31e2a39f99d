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
//! model on the next port, the mailer on the one after; it prints `listening api=… model=…
//! mailer=…` once all three are bound, and exits if one is taken). Each role runs until SIGTERM or
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
        Role::Api => api::serve(&args, bind(args.addr).await?, shutdown).await,
        Role::Worker => worker::run(&args, shutdown).await,
        Role::Relay => relay::run(&args, shutdown).await,
        Role::Model => model::serve(bind(args.addr).await?, shutdown).await,
        Role::Mailer => mailer::serve(bind(args.addr).await?, shutdown).await,
        Role::All => all(args, shutdown).await,
    }
}

async fn bind(addr: std::net::SocketAddr) -> Result<tokio::net::TcpListener, BoxError> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| format!("cannot listen on {addr}: {e}").into())
}

/// Every role in one process, on consecutive ports.
async fn all(mut args: Args, shutdown: tower_once::ShutdownSignal) -> Result<(), BoxError> {
    let api_addr = args.addr;
    let model_addr = args::next_port(api_addr, 1)?;
    let mailer_addr = args::next_port(api_addr, 2)?;
    args.model = format!("http://{model_addr}");
    args.mailer = format!("http://{mailer_addr}");
    // Every port is bound before any role starts: one already taken ends the process at once
    // (rather than leaving the others running against someone else's server), and the line
    // below is printed only once all three accept connections.
    let (api_listener, model_listener, mailer_listener) = (
        bind(api_addr).await?,
        bind(model_addr).await?,
        bind(mailer_addr).await?,
    );
    println!("listening api={api_addr} model={model_addr} mailer={mailer_addr}");
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let wait = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };
    // A role that fails stops the others: the process exits with its error rather than
    // running on without it.
    let stop_on_error = |result: Result<(), BoxError>| {
        if result.is_err() {
            let _ = stop.send(true);
        }
        result
    };
    // Joined, not spawned: every role runs on this task's runtime until its own shutdown.
    let roles = async {
        tokio::join!(
            async { stop_on_error(model::serve(model_listener, wait(stopped.clone())).await) },
            async { stop_on_error(mailer::serve(mailer_listener, wait(stopped.clone())).await) },
            async { stop_on_error(api::serve(&args, api_listener, wait(stopped.clone())).await) },
            async { stop_on_error(worker::run(&args, wait(stopped.clone())).await) },
            async { stop_on_error(relay::run(&args, wait(stopped.clone())).await) },
        )
    };
    tracing::info!(%api_addr, %model_addr, %mailer_addr, "pipeline running");
    tokio::pin!(roles);
    let (model, mailer, api, worker, relay) = tokio::select! {
        results = &mut roles => results,
        () = shutdown => {
            let _ = stop.send(true);
            roles.await
        }
    };
    model?;
    mailer?;
    api?;
    worker?;
    relay
}
