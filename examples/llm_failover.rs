//! An LLM client that fails over: retry + circuit breaker on the primary provider, fallback to
//! the secondary, one deadline per request.
//!
//! ```sh
//! cargo run --example llm_failover --features hyper-util -- \
//!     --primary http://127.0.0.1:8001 --secondary http://127.0.0.1:8002 \
//!     [--requests 50] [--concurrency 8] [--deadline-ms 10000]
//! ```
//!
//! Each request is `POST {provider}/v1/messages` with `{"prompt": "p<i>"}` and no
//! `Idempotency-Key`: a completion has no side effects, so it is marked `SafeToRetry` (retried
//! without a key) and any failure may go to the secondary.
//! The stack, per request:
//!
//! ```text
//! HttpFallbackLayer (side-effect free, the deadline: 10 s by default)
//! ├── primary:   CircuitBreakerLayer::http() → RetryLayer (3 attempts, 60 % of the deadline)
//! │              → HttpTimeoutLayer (a quarter of the deadline per attempt) → hyper client
//! └── secondary: RetryLayer (3 attempts) → HttpTimeoutLayer → hyper client
//! ```
//!
//! The breaker sits outside the primary's retries: it counts each request once, and once open
//! it refuses at once, so requests go straight to the secondary instead of waiting for the
//! primary. The retry layer honours `retry-after-ms`, `Retry-After` and `x-should-retry`, and
//! retries `529` (overloaded), `429` and `5xx`.
//!
//! One JSON line per finished request on stdout, as it finishes:
//! `{"i": 3, "status": 200, "provider": "secondary", "attempts": 4, "ms": 812}` (`provider` is
//! `null` and `status` the last status or `null` when it failed), then a summary:
//! `{"ok": 50, "failed": 0, "primary_calls": 61, "secondary_calls": 40, "breaker_opens": 1}`.
//! Exit status 0 when every request got a 2xx, 1 otherwise, 2 on bad arguments.

use bytes::Bytes;
use http::{Request, Uri};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::json;
use std::io::Write;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_once::breaker::{hook::StateChange, CircuitBreakerLayer, CircuitState};
use tower_once::core::resend::SafeToRetry;
use tower_once::fallback::http::{FromSecondary, HttpFallbackLayer};
use tower_once::retry::RetryLayer;
use tower_once::timeout::http::HttpTimeoutLayer;

struct Args {
    primary: Uri,
    secondary: Uri,
    requests: u32,
    concurrency: usize,
    deadline: Duration,
}

const USAGE: &str = "usage: llm_failover --primary URL --secondary URL [--requests N] \
[--concurrency N] [--deadline-ms N]";

fn parse_args() -> Result<Args, String> {
    let mut argv = Vec::new();
    for arg in std::env::args_os().skip(1) {
        argv.push(
            arg.into_string()
                .map_err(|a| format!("not UTF-8: {a:?}\n{USAGE}"))?,
        );
    }
    let mut argv = argv.into_iter();
    let (mut primary, mut secondary) = (None, None);
    let mut args = Args {
        primary: Uri::from_static("http://127.0.0.1"),
        secondary: Uri::from_static("http://127.0.0.1"),
        requests: 20,
        concurrency: 4,
        deadline: Duration::from_millis(10_000),
    };
    let number = |flag: &str, value: Option<String>| -> Result<u64, String> {
        value
            .ok_or_else(|| format!("{flag} needs a value"))?
            .parse()
            .map_err(|e| format!("{flag}: {e}"))
    };
    let base = |flag: &str, value: Option<String>| -> Result<Uri, String> {
        let value = value.ok_or_else(|| format!("{flag} needs a URL"))?;
        let uri: Uri = value.parse().map_err(|e| format!("{flag}: {e}"))?;
        match (uri.scheme_str(), uri.authority()) {
            (Some("http"), Some(_)) => Ok(uri),
            _ => Err(format!("{flag}: an http:// URL with a host, not {value:?}")),
        }
    };
    while let Some(arg) = argv.next() {
        match arg.as_str() {
            "--primary" => primary = Some(base(&arg, argv.next())?),
            "--secondary" => secondary = Some(base(&arg, argv.next())?),
            "--requests" => {
                args.requests = u32::try_from(number(&arg, argv.next())?)
                    .map_err(|_| "--requests: too many".to_owned())?
            }
            "--concurrency" => {
                args.concurrency = usize::try_from(number(&arg, argv.next())?)
                    .ok()
                    .filter(|n| (1..=1024).contains(n))
                    .ok_or("--concurrency must be 1 to 1024")?
            }
            "--deadline-ms" => {
                args.deadline =
                    Duration::from_millis(number(&arg, argv.next())?.clamp(10, 24 * 3600 * 1000))
            }
            "-h" | "--help" => return Err(USAGE.into()),
            other => return Err(format!("unexpected argument {other}\n{USAGE}")),
        }
    }
    args.primary = primary.ok_or(USAGE)?;
    args.secondary = secondary.ok_or(USAGE)?;
    Ok(args)
}

/// A request's own count of the calls made for it, on its extensions (copied to every
/// retry and to the fallback).
#[derive(Clone, Default)]
struct Attempts(Arc<AtomicU32>);

/// The transport of one provider: rewrites the request to the provider's base URL (its scheme,
/// authority and path prefix, then the request's own path: `http://host/api` gets
/// `/api/v1/messages`), counts the call (for the provider and for the request), and sends it.
fn provider<S, B>(
    client: S,
    base: Uri,
    calls: Arc<AtomicU64>,
) -> impl Service<
    Request<B>,
    Response = S::Response,
    Error = S::Error,
    Future = tower::util::Oneshot<S, Request<B>>,
> + Clone
where
    S: Service<Request<B>> + Clone,
{
    let prefix = base.path().trim_end_matches('/').to_owned();
    tower::service_fn(move |mut req: Request<B>| {
        let path = req
            .uri()
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_owned();
        let mut parts = req.uri().clone().into_parts();
        parts.scheme = base.scheme().cloned();
        parts.authority = base.authority().cloned();
        parts.path_and_query = format!("{prefix}{path}").parse().ok();
        if let Ok(uri) = Uri::from_parts(parts) {
            *req.uri_mut() = uri;
        }
        calls.fetch_add(1, SeqCst);
        if let Some(attempts) = req.extensions().get::<Attempts>() {
            attempts.0.fetch_add(1, SeqCst);
        }
        client.clone().oneshot(req)
    })
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(args) => args,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::from(2);
        }
    };
    let client = Client::builder(TokioExecutor::new()).build_http();
    let primary_calls = Arc::new(AtomicU64::new(0));
    let secondary_calls = Arc::new(AtomicU64::new(0));
    let opens = Arc::new(AtomicU64::new(0));
    let counted_opens = opens.clone();
    let attempt_timeout = args.deadline / 4;

    let secondary = ServiceBuilder::new()
        .layer(RetryLayer::new().max_attempts(3).into_http())
        .layer(HttpTimeoutLayer::new(attempt_timeout).cover_body(true))
        .service(provider(
            client.clone(),
            args.secondary.clone(),
            secondary_calls.clone(),
        ));
    let breaker = CircuitBreakerLayer::http().on_state_change(move |change: &StateChange<'_>| {
        if change.to == CircuitState::Open {
            counted_opens.fetch_add(1, SeqCst);
        }
        eprintln!(
            "circuit {}: {} -> {} ({})",
            change.circuit, change.from, change.to, change.cause
        );
    });
    let svc = ServiceBuilder::new()
        .layer(
            HttpFallbackLayer::new(secondary)
                .side_effect_free(true)
                .deadline(args.deadline),
        )
        .layer(breaker)
        // The primary gets 60 % of the deadline: the rest is the secondary's.
        .layer(
            RetryLayer::new()
                .max_attempts(3)
                .deadline(args.deadline.mul_f64(0.6))
                .into_http(),
        )
        .layer(HttpTimeoutLayer::new(attempt_timeout))
        .service(provider(
            client,
            args.primary.clone(),
            primary_calls.clone(),
        ));

    let (mut ok, mut failed) = (0u64, 0u64);
    let mut tally = |line: serde_json::Value| {
        if line["provider"].is_string() {
            ok += 1;
        } else {
            failed += 1;
        }
    };
    let limit = Arc::new(tokio::sync::Semaphore::new(args.concurrency));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..args.requests {
        let Ok(permit) = limit.clone().acquire_owned().await else {
            break;
        };
        let svc = svc.clone();
        let primary = args.primary.clone();
        let deadline = args.deadline;
        tasks.spawn(async move {
            let _permit = permit;
            let attempts = Attempts::default();
            let body = json!({ "prompt": format!("p{i}") }).to_string();
            // The primary's authority names its circuit; each provider's transport puts its
            // own base URL in front of the path.
            let authority = primary.authority().map_or("localhost", |a| a.as_str());
            let uri = format!("http://{authority}/v1/messages");
            let mut req = match Request::post(uri)
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from(body)))
            {
                Ok(req) => req,
                Err(e) => return json!({ "i": i, "status": null, "provider": null, "error": e.to_string() }),
            };
            req.extensions_mut().insert(attempts.clone());
            // A completion has no side effects: it may be sent again (retried, and to the
            // secondary) without an Idempotency-Key, which providers ignore or refuse.
            req.extensions_mut().insert(SafeToRetry);
            let started = tokio::time::Instant::now();
            let outcome = svc.oneshot(req).await;
            let ms = started.elapsed().as_millis() as u64;
            let attempts = attempts.0.load(SeqCst);
            match outcome {
                Ok(response) => {
                    let status = response.status();
                    let provider = if !status.is_success() {
                        None
                    } else if response.extensions().get::<FromSecondary>().is_some() {
                        Some("secondary")
                    } else {
                        Some("primary")
                    };
                    // Read the completion, as a client does: within the deadline (the attempt's
                    // timeout covers the body too) and up to 16 MiB.
                    let read = tokio::time::timeout_at(
                        started + deadline,
                        Limited::new(response.into_body(), 16 << 20).collect(),
                    )
                    .await;
                    let ms = started.elapsed().as_millis() as u64;
                    match read {
                        Ok(Ok(_)) => json!({ "i": i, "status": status.as_u16(), "provider": provider, "attempts": attempts, "ms": ms }),
                        Ok(Err(e)) => json!({ "i": i, "status": status.as_u16(), "provider": null, "attempts": attempts, "ms": ms, "error": format!("reading the completion: {e}") }),
                        Err(_) => json!({ "i": i, "status": status.as_u16(), "provider": null, "attempts": attempts, "ms": ms, "error": "the completion did not arrive by the deadline" }),
                    }
                }
                Err(error) => {
                    json!({ "i": i, "status": null, "provider": null, "attempts": attempts, "ms": ms, "error": error.to_string() })
                }
            }
        });
        while let Some(done) = tasks.try_join_next() {
            tally(report(done));
        }
    }
    while let Some(done) = tasks.join_next().await {
        tally(report(done));
    }
    println!(
        "{}",
        json!({
            "ok": ok,
            "failed": failed,
            "primary_calls": primary_calls.load(SeqCst),
            "secondary_calls": secondary_calls.load(SeqCst),
            "breaker_opens": opens.load(SeqCst),
        })
    );
    let _ = std::io::stdout().flush();
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Prints a finished request's line, flushed, and returns it.
fn report(done: Result<serde_json::Value, tokio::task::JoinError>) -> serde_json::Value {
    let line = match done {
        Ok(line) => line,
        Err(e) => json!({ "status": null, "provider": null, "error": e.to_string() }),
    };
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
    line
}
