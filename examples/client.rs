//! The demo client: a hyper-util client behind `RetryLayer` (HTTP form) and `HttpTimeoutLayer`.
//!
//! ```sh
//! cargo run --example client --features retry -- http://127.0.0.1:3000/charges \
//!     --data '{"order_id":"A","amount":500}' --max-attempts 4 --timeout-ms 2000 --deadline-ms 10000
//! ```
//!
//! Each retry is printed on stderr (attempt, reason, delay), and so is every request sent
//! (`send: request N`); the final status and body go to stdout. Exit status 0 on a 2xx answer,
//! 1 otherwise. A POST gets a generated `Idempotency-Key` (the same on every attempt) unless
//! `--idempotency-key none` or an explicit key is given.
//!
//! With `--hedge-after-ms N`, an attempt still unanswered after N ms gets one hedge: the same
//! request with the same `Idempotency-Key` (a `HttpHedgeLayer` under the retry layer, sharing
//! its budget); the first good answer wins. A POST without a key is never hedged.

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Method, Request};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::process::ExitCode;
use std::time::Duration;
use tower::{ServiceBuilder, ServiceExt};
use tower_once::hedge::http::HttpHedgeLayer;
use tower_once::retry::backoff::Backoff;
use tower_once::retry::budget::RetryBudget;
use tower_once::retry::classify::HttpClassifier;
use tower_once::retry::hook::RetryEvent;
use tower_once::retry::RetryLayer;
use tower_once::timeout::http::HttpTimeoutLayer;

struct Args {
    url: String,
    method: Option<Method>,
    data: Option<String>,
    headers: Vec<(HeaderName, HeaderValue)>,
    max_attempts: u32,
    timeout: Duration,
    deadline: Duration,
    key: KeyMode,
    seed: Option<u64>,
    backoff_ms: u64,
    hedge_after: Option<Duration>,
}

enum KeyMode {
    Auto,
    None,
    Fixed(HeaderValue),
}

const USAGE: &str = "usage: client URL [--method M] [--data BODY] [-H 'Name: value']... \
[--max-attempts N] [--timeout-ms N] [--deadline-ms N] [--idempotency-key auto|none|KEY] \
[--seed N] [--backoff-ms N] [--hedge-after-ms N]";

fn parse_args() -> Result<Args, String> {
    let mut argv = std::env::args().skip(1);
    let mut args = Args {
        url: String::new(),
        method: None,
        data: None,
        headers: Vec::new(),
        max_attempts: 4,
        timeout: Duration::from_secs(10),
        deadline: Duration::from_secs(30),
        key: KeyMode::Auto,
        seed: None,
        backoff_ms: 500,
        hedge_after: None,
    };
    let number = |flag: &str, value: Option<String>| -> Result<u64, String> {
        value
            .ok_or_else(|| format!("{flag} needs a value"))?
            .parse()
            .map_err(|e| format!("{flag}: {e}"))
    };
    while let Some(arg) = argv.next() {
        match arg.as_str() {
            "--method" => {
                let m = argv.next().ok_or("--method needs a value")?;
                args.method = Some(Method::from_bytes(m.as_bytes()).map_err(|e| e.to_string())?);
            }
            "--data" => args.data = Some(argv.next().ok_or("--data needs a value")?),
            "-H" => {
                let h = argv.next().ok_or("-H needs a value")?;
                let (name, value) = h.split_once(':').ok_or("-H takes 'Name: value'")?;
                args.headers.push((
                    HeaderName::from_bytes(name.trim().as_bytes()).map_err(|e| e.to_string())?,
                    HeaderValue::from_str(value.trim()).map_err(|e| e.to_string())?,
                ));
            }
            "--max-attempts" => {
                let n = number(&arg, argv.next())?;
                args.max_attempts = u32::try_from(n)
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or("--max-attempts must be 1 or more")?;
            }
            "--timeout-ms" => {
                args.timeout = Duration::from_millis(number(&arg, argv.next())?.max(1))
            }
            "--deadline-ms" => {
                args.deadline = Duration::from_millis(number(&arg, argv.next())?.max(1))
            }
            "--seed" => args.seed = Some(number(&arg, argv.next())?),
            "--backoff-ms" => args.backoff_ms = number(&arg, argv.next())?.max(1),
            "--hedge-after-ms" => {
                args.hedge_after = Some(Duration::from_millis(number(&arg, argv.next())?.max(1)))
            }
            "--idempotency-key" => {
                args.key = match argv
                    .next()
                    .ok_or("--idempotency-key needs a value")?
                    .as_str()
                {
                    "auto" => KeyMode::Auto,
                    "none" => KeyMode::None,
                    key => KeyMode::Fixed(HeaderValue::from_str(key).map_err(|e| e.to_string())?),
                }
            }
            "-h" | "--help" => return Err(USAGE.into()),
            url if args.url.is_empty() && !url.starts_with('-') => args.url = url.to_owned(),
            other => return Err(format!("unexpected argument {other}\n{USAGE}")),
        }
    }
    if args.url.is_empty() {
        return Err(USAGE.into());
    }
    Ok(args)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(args) => args,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::from(2);
        }
    };
    let method = args.method.clone().unwrap_or(if args.data.is_some() {
        Method::POST
    } else {
        Method::GET
    });
    let mut request = Request::builder().method(method).uri(&args.url);
    for (name, value) in &args.headers {
        request = request.header(name, value);
    }
    if args.data.is_some()
        && !args
            .headers
            .iter()
            .any(|(n, _)| n == http::header::CONTENT_TYPE)
    {
        request = request.header(http::header::CONTENT_TYPE, "application/json");
    }
    if let KeyMode::Fixed(key) = &args.key {
        request = request.header("idempotency-key", key);
    }
    let body = Full::new(Bytes::from(args.data.clone().unwrap_or_default()));
    let request = match request.body(body) {
        Ok(request) => request,
        Err(e) => {
            eprintln!("invalid request: {e}");
            return ExitCode::from(2);
        }
    };

    let backoff = match Backoff::new(
        Duration::from_millis(args.backoff_ms),
        2.0,
        Duration::from_millis(args.backoff_ms * 16),
    ) {
        Ok(backoff) => backoff,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let budget = RetryBudget::default();
    let mut retry = RetryLayer::new()
        .max_attempts(args.max_attempts)
        .deadline(args.deadline)
        .backoff(backoff)
        .budget(budget.clone())
        .classify(HttpClassifier);
    if let Some(seed) = args.seed {
        retry = retry.rng_seed(seed);
    }
    let retry = retry
        .on_retry(|event: &RetryEvent<'_, http::Response<_>, _>| {
            let reason = match event.outcome {
                Ok(response) => format!("status {}", response.status()),
                Err(error) => format!("error: {error}"),
            };
            let source = if event.from_server {
                " (server asked)"
            } else {
                ""
            };
            eprintln!(
                "retry: attempt {} failed with {reason}; waiting {} ms{source}",
                event.attempt,
                event.delay.as_millis()
            );
        })
        .into_http()
        .stamp_idempotency_keys(matches!(args.key, KeyMode::Auto));
    let timeout = HttpTimeoutLayer::new(args.timeout).cover_body(true);
    let started = tokio::time::Instant::now();
    // Two stacks: with a hedging layer, the transport sees its copies' body type.
    let sent = match args.hedge_after {
        Some(after) => {
            let hedge = HttpHedgeLayer::new(after).budget(budget);
            let svc = ServiceBuilder::new()
                .layer(retry)
                .layer(hedge)
                .layer(timeout)
                .service(counted(Client::builder(TokioExecutor::new()).build_http()));
            svc.oneshot(request).await
        }
        None => {
            let svc = ServiceBuilder::new()
                .layer(retry)
                .layer(timeout)
                .service(counted(Client::builder(TokioExecutor::new()).build_http()));
            svc.oneshot(request).await
        }
    };
    let response = match sent {
        Ok(response) => response,
        Err(error) => {
            eprintln!("error: {error} ({} ms)", started.elapsed().as_millis());
            return ExitCode::FAILURE;
        }
    };
    let status = response.status();
    let replayed = response.headers().contains_key("idempotent-replayed");
    let body = match response.into_body().collect().await {
        Ok(body) => body.to_bytes(),
        Err(error) => {
            eprintln!("error reading the body: {error}");
            return ExitCode::FAILURE;
        }
    };
    println!("{}{}", status, if replayed { " (replayed)" } else { "" });
    println!("{}", String::from_utf8_lossy(&body));
    if status.is_success() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// The transport, printing each request it sends (retries and hedges included) on stderr.
fn counted<S, Req>(
    client: S,
) -> impl tower::Service<
    Req,
    Response = S::Response,
    Error = S::Error,
    Future = tower::util::Oneshot<S, Req>,
> + Clone
where
    S: tower::Service<Req> + Clone,
{
    let sent = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    tower::service_fn(move |req: Req| {
        let n = sent.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        eprintln!("send: request {n}");
        client.clone().oneshot(req)
    })
}
