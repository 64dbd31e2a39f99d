//! An agent harness whose tool calls run once: each run makes three tool calls against a
//! payments API, each one a durable step (`tower_once::step`) kept in Redis, so a retry, a
//! restart or a second process never refunds twice, and a note that cannot be made safe is
//! never sent twice.
//!
//! ```sh
//! cargo run --example agent --features redis -- --payments http://127.0.0.1:4000 \
//!     --state redis://127.0.0.1:6379/0 --runs 20 [--concurrency 4] [--timeout-ms 500] \
//!     [--deadline-ms 10000] [--amount 40]
//! ```
//!
//! For each run `run-{r}`, in order, stopping at a step that did not succeed:
//! 1. `lookup`: `GET {URL}/orders/run-{r}`: idempotent, retried on a timeout;
//! 2. `refund`: `POST {URL}/refunds` `{"run", "amount"}`, keyed: the same `Idempotency-Key`
//!    (derived from run, step and tool) on every attempt, after a restart and in another
//!    process;
//! 3. `note`: `POST {URL}/notes` `{"run", "text": "refunded"}`, unkeyed: never sent twice; a
//!    note whose call timed out, or that a killed process had sent, is reported `unknown`.
//!
//! stdout: one JSON line per step once its outcome is recorded, then a summary line; exit 0
//! when no step failed. `STATE` is `redis://host:port/db` (the db number separates
//! namespaces), `postgres://…` with the `postgres` feature, or `memory` (this process only).

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;
use tower::{BoxError, Layer, Service, ServiceBuilder, ServiceExt};
use tower_once::core::classify::{Action, Classify, HttpClassifier};
use tower_once::core::deadline::Deadline;
use tower_once::idempotency::store::{IdempotencyStore, MemoryStore};
use tower_once::retry::backoff::Backoff;
use tower_once::retry::http::BufferedBody;
use tower_once::retry::RetryLayer;
use tower_once::step::{Step, StepError, StepId, StepLayer, StepOutput};
use tower_once::timeout::http::HttpTimeoutLayer;

const USAGE: &str = "usage: agent --payments URL --state STATE --runs N [--concurrency N] \
[--timeout-ms N] [--deadline-ms N] [--amount N]";

struct Args {
    payments: String,
    state: String,
    runs: u32,
    concurrency: usize,
    timeout: Duration,
    deadline: Duration,
    amount: u64,
}

fn parse_args() -> Result<Args, String> {
    let mut argv = std::env::args().skip(1);
    let (mut payments, mut state, mut runs) = (None, None, None);
    let mut args = Args {
        payments: String::new(),
        state: String::new(),
        runs: 0,
        concurrency: 4,
        timeout: Duration::from_millis(500),
        deadline: Duration::from_millis(10_000),
        amount: 40,
    };
    let number = |name: &str, value: Option<String>| -> Result<u64, String> {
        let value = value.ok_or_else(|| format!("{name} needs a value\n{USAGE}"))?;
        value
            .parse()
            .map_err(|_| format!("{name}: not a number: {value}"))
    };
    while let Some(arg) = argv.next() {
        match arg.as_str() {
            "--payments" => payments = argv.next(),
            "--state" => state = argv.next(),
            "--runs" => runs = Some(number(&arg, argv.next())?),
            "--concurrency" => {
                args.concurrency = number(&arg, argv.next())?.clamp(1, 1024) as usize
            }
            "--timeout-ms" => {
                args.timeout = Duration::from_millis(number(&arg, argv.next())?.max(1))
            }
            "--deadline-ms" => {
                args.deadline = Duration::from_millis(number(&arg, argv.next())?.max(1))
            }
            "--amount" => args.amount = number(&arg, argv.next())?,
            "-h" | "--help" => return Err(USAGE.into()),
            other => return Err(format!("unexpected argument {other}\n{USAGE}")),
        }
    }
    args.payments = payments
        .ok_or_else(|| format!("--payments is required\n{USAGE}"))?
        .trim_end_matches('/')
        .to_owned();
    args.state = state.ok_or_else(|| format!("--state is required\n{USAGE}"))?;
    let runs = runs.ok_or_else(|| format!("--runs is required\n{USAGE}"))?;
    args.runs = u32::try_from(runs).map_err(|_| format!("--runs: too many: {runs}"))?;
    Ok(args)
}

/// What a tool answered: its status and JSON body. This is what a step stores and replays.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct ToolResult {
    status: u16,
    body: Value,
}

/// The requests this process sent for one step (retries included), counted below the retry
/// layer.
#[derive(Clone, Default)]
struct Attempts(Arc<AtomicU32>);

type ToolRequest = Request<Full<Bytes>>;

/// The tool client: retry (one deadline per step, a keyed POST retried with its key, an
/// unkeyed POST never), a timeout per attempt, a hyper client; the answer read into a
/// `ToolResult`.
fn tool_client(
    args: &Args,
) -> impl Service<ToolRequest, Response = ToolResult, Error = BoxError, Future: Send> + Clone + Send
{
    let backoff = Backoff::new(Duration::from_millis(50), 2.0, Duration::from_secs(1))
        .unwrap_or_else(|_| unreachable!("valid constants"));
    let retry = RetryLayer::new()
        .max_attempts(20)
        .backoff(backoff)
        // Bounded by --deadline-ms and the attempts: every run of a slow API retries at once.
        .no_budget()
        .classify(KeyInUse)
        .into_http();
    let client = Client::builder(TokioExecutor::new()).build_http::<BufferedBody<Full<Bytes>>>();
    let counted = tower::service_fn(move |req: Request<BufferedBody<Full<Bytes>>>| {
        if let Some(attempts) = req.extensions().get::<Attempts>() {
            attempts.0.fetch_add(1, Relaxed);
        }
        client.request(req)
    });
    let stack = ServiceBuilder::new()
        .layer(retry)
        .layer(HttpTimeoutLayer::new(args.timeout))
        .service(counted);
    tower::service_fn(move |req: ToolRequest| {
        let stack = stack.clone();
        async move {
            let response = stack.oneshot(req).await.map_err(BoxError::from)?;
            let status = response.status().as_u16();
            let body = Limited::new(response.into_body(), 1024 * 1024)
                .collect()
                .await?
                .to_bytes();
            let body = serde_json::from_slice(&body)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into_owned()));
            Ok::<_, BoxError>(ToolResult { status, body })
        }
    })
}

/// The payments API's `409` means "this key's first request is still running": asked again,
/// as any answer in progress; the rest as HTTP says.
#[derive(Debug, Clone, Copy)]
struct KeyInUse;

impl<B, E> Classify<http::Response<B>, E> for KeyInUse {
    fn classify(&self, outcome: &Result<http::Response<B>, E>) -> Action {
        match outcome {
            Ok(response) if response.status() == http::StatusCode::CONFLICT => {
                Action::InProgress { after: None }
            }
            other => HttpClassifier.classify(other),
        }
    }
}

/// A 2xx is the tool's result, stored; anything else is returned and never stored. A 5xx or
/// a 429 may have had its effect (a note sent through a failing gateway): never sent again.
fn succeeded(outcome: &Result<ToolResult, BoxError>) -> Action {
    match outcome {
        Ok(result) if (200..300).contains(&result.status) => Action::Success,
        Ok(result) if result.status >= 500 || result.status == 429 => Action::Retry { after: None },
        Ok(_) => Action::Stop,
        Err(_) => Action::Retry { after: None },
    }
}

#[derive(Default)]
struct Summary {
    steps: AtomicU64,
    called: AtomicU64,
    replayed: AtomicU64,
    unknown: AtomicU64,
    mismatch: AtomicU64,
    failed: AtomicU64,
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    let args = match parse_args() {
        Ok(args) => args,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::from(2);
        }
    };
    if args.state == "memory" {
        return agent(args, MemoryStore::new()).await;
    }
    if args.state.starts_with("redis://") {
        #[cfg(feature = "redis")]
        {
            use tower_once::idempotency::store::redis::RedisStore;
            return match RedisStore::connect(&args.state).await {
                Ok(store) => agent(args, store).await,
                Err(error) => {
                    eprintln!("cannot reach the state store {}: {error}", args.state);
                    ExitCode::FAILURE
                }
            };
        }
        #[cfg(not(feature = "redis"))]
        {
            eprintln!("a redis:// state needs --features redis");
            return ExitCode::from(2);
        }
    }
    if args.state.starts_with("postgres://") || args.state.starts_with("postgresql://") {
        #[cfg(feature = "postgres")]
        {
            use tower_once::idempotency::store::postgres::PostgresStore;
            let store = match PostgresStore::connect(&args.state).await {
                Ok(store) => store,
                Err(error) => {
                    eprintln!("cannot reach the state store: {error}");
                    return ExitCode::FAILURE;
                }
            };
            if let Err(error) = store.migrate().await {
                eprintln!("cannot migrate the state store: {error}");
                return ExitCode::FAILURE;
            }
            return agent(args, store).await;
        }
        #[cfg(not(feature = "postgres"))]
        {
            eprintln!("a postgres:// state needs --features postgres");
            return ExitCode::from(2);
        }
    }
    eprintln!("--state: redis://host:port/db, postgres://…, or memory\n{USAGE}");
    ExitCode::from(2)
}

async fn agent<St: IdempotencyStore>(args: Args, store: St) -> ExitCode {
    let steps = StepLayer::new(store)
        // Short, so a step a killed process left is settled within a few seconds; renewed
        // every third of it while the call runs.
        .lease(Duration::from_secs(2))
        .classify(succeeded)
        .layer(tool_client(&args));
    let args = Arc::new(args);
    let summary = Arc::new(Summary::default());
    let slots = Arc::new(Semaphore::new(args.concurrency));
    let mut runs = tokio::task::JoinSet::new();
    for r in 0..args.runs {
        let (steps, args, summary, slots) = (
            steps.clone(),
            Arc::clone(&args),
            Arc::clone(&summary),
            Arc::clone(&slots),
        );
        runs.spawn(async move {
            let Ok(_slot) = slots.acquire_owned().await else {
                return;
            };
            run(steps, &args, &summary, format!("run-{r}")).await;
        });
    }
    while runs.join_next().await.is_some() {}
    let count = |n: &AtomicU64| n.load(Relaxed);
    println!(
        "{}",
        json!({ "summary": {
            "steps": count(&summary.steps),
            "called": count(&summary.called),
            "replayed": count(&summary.replayed),
            "unknown": count(&summary.unknown),
            "mismatch": count(&summary.mismatch),
            "failed": count(&summary.failed),
        }})
    );
    if count(&summary.failed) == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// One run: its three steps in order, stopping at one that did not succeed.
async fn run<S>(mut steps: S, args: &Args, summary: &Summary, run: String)
where
    S: Service<Step<ToolRequest>, Response = StepOutput<ToolResult>, Error = StepError<BoxError>>,
{
    let refund = json!({ "run": run, "amount": args.amount }).to_string();
    let note = json!({ "run": run, "text": "refunded" }).to_string();
    let calls = [
        ("lookup", "GET", format!("/orders/{run}"), None),
        ("refund", "POST", "/refunds".to_owned(), Some(refund)),
        ("note", "POST", "/notes".to_owned(), Some(note)),
    ];
    for (position, (tool, method, path, body)) in (1..).zip(calls) {
        let attempts = Attempts::default();
        let mut request = Request::builder()
            .method(method)
            .uri(format!("{}{path}", args.payments))
            .header(http::header::CONTENT_TYPE, "application/json")
            .extension(attempts.clone())
            .body(Full::new(Bytes::from(body.clone().unwrap_or_default())))
            .unwrap_or_else(|_| unreachable!("a valid URL was given"));
        Deadline::after(args.deadline).attach(&mut request);
        // The arguments are the tool's own (path and body), not the API's address.
        let mut step = Step::new(StepId::new(run.as_str(), position, tool), request)
            .arguments(format!("{method} {path} {}", body.unwrap_or_default()));
        if tool == "refund" {
            step = step.keyed();
        }
        let result = match steps.ready().await {
            Ok(steps) => steps.call(step).await,
            Err(error) => Err(error),
        };
        let sent = attempts.0.load(Relaxed);
        let (outcome, counter) = match &result {
            Ok(out) if out.is_replayed() => ("replayed", &summary.replayed),
            Ok(out) if out.is_recorded() => ("called", &summary.called),
            Err(e) if e.is_unknown() => ("unknown", &summary.unknown),
            Err(e) if e.is_mismatch() => ("mismatch", &summary.mismatch),
            _ => ("failed", &summary.failed),
        };
        match &result {
            Ok(out) if !out.is_recorded() => eprintln!(
                "{run} {tool}: answered {} {}",
                out.value().status,
                out.value().body
            ),
            Err(error) if !error.is_unknown() && !error.is_mismatch() => {
                eprintln!("{run} {tool}: {error}")
            }
            _ => {}
        }
        summary.steps.fetch_add(1, Relaxed);
        counter.fetch_add(1, Relaxed);
        println!(
            "{}",
            json!({ "run": run, "step": position, "tool": tool, "outcome": outcome, "attempts": sent })
        );
        if !matches!(outcome, "called" | "replayed") {
            return;
        }
    }
}
