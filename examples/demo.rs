//! The whole story in one process, no services needed: exactly-once effects over a network that
//! loses answers, throttles and hangs.
//!
//! ```sh
//! cargo run --example demo --features retry            # a random seed
//! cargo run --example demo --features retry -- --seed 7  # reproducible delays
//! ```
//!
//! The demo charge server (idempotency layer on the in-memory store) sits behind a scripted
//! flaky network; the client is a `RetryLayer` (HTTP form) over an `HttpTimeoutLayer`. Each
//! message carries its own idempotency key, as a queue message would, so a redelivery is the
//! same operation to the server.

#[allow(dead_code)] // the demo uses the in-memory ledger only
#[path = "server/app.rs"]
mod app;

use axum::body::Body;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_once::idempotency::store::MemoryStore;
use tower_once::retry::backoff::Backoff;
use tower_once::retry::classify::HttpClassifier;
use tower_once::retry::hook::RetryEvent;
use tower_once::retry::RetryLayer;
use tower_once::timeout::http::HttpTimeoutLayer;

/// What the network does to one delivery of a message.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Fault {
    /// Deliver and bring the answer back.
    None,
    /// Deliver (the server does the work), then lose the answer: the client sees a reset.
    LoseAnswer,
    /// Never deliver; answer 503 Service Unavailable.
    Unavailable,
    /// Never deliver; answer 429 Too Many Requests with `Retry-After: 1`.
    Throttle,
    /// Never deliver and never answer.
    Hang,
}

/// A network failure, as a transport would report it.
#[derive(Debug)]
struct NetworkError(&'static str);

impl fmt::Display for NetworkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

impl std::error::Error for NetworkError {}

/// What crossed the network, for the closing table.
#[derive(Debug, Default)]
struct Traffic {
    deliveries: u64,
    replays: u64,
    conflicts: u64,
    mismatches: u64,
}

/// Per message id: the faults for its deliveries (the last one repeats), and how many happened.
type Scripts = Arc<Mutex<HashMap<String, (Vec<Fault>, usize)>>>;

/// The flaky network between the client and the server.
#[derive(Clone)]
struct FlakyNetwork {
    server: axum::Router,
    scripts: Scripts,
    traffic: Arc<Mutex<Traffic>>,
}

impl<B> Service<Request<B>> for FlakyNetwork
where
    B: axum::body::HttpBody<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Response = Response<Body>;
    type Error = NetworkError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, NetworkError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), NetworkError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let message = req
            .headers()
            .get("idempotency-key")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        let fault = {
            let mut scripts = self.scripts.lock().unwrap_or_else(|e| e.into_inner());
            match scripts.get_mut(&message) {
                Some((script, n)) => {
                    let fault = script[(*n).min(script.len() - 1)];
                    *n += 1;
                    fault
                }
                None => Fault::None,
            }
        };
        let server = self.server.clone();
        let traffic = self.traffic.clone();
        Box::pin(async move {
            match fault {
                Fault::Unavailable => return Ok(status(StatusCode::SERVICE_UNAVAILABLE, None)),
                Fault::Throttle => return Ok(status(StatusCode::TOO_MANY_REQUESTS, Some("1"))),
                Fault::Hang => std::future::pending::<()>().await,
                Fault::None | Fault::LoseAnswer => {}
            }
            let response = server
                .oneshot(req.map(Body::new))
                .await
                .unwrap_or_else(|e| match e {});
            {
                let mut t = traffic.lock().unwrap_or_else(|e| e.into_inner());
                t.deliveries += 1;
                t.replays += u64::from(response.headers().contains_key("idempotent-replayed"));
                t.conflicts += u64::from(response.status() == StatusCode::CONFLICT);
                t.mismatches += u64::from(response.status() == StatusCode::UNPROCESSABLE_ENTITY);
            }
            if fault == Fault::LoseAnswer {
                println!(
                    "    network: delivered, the server answered {}; the answer was lost",
                    response.status()
                );
                return Err(NetworkError("connection reset before the answer arrived"));
            }
            Ok(response)
        })
    }
}

fn status(status: StatusCode, retry_after: Option<&'static str>) -> Response<Body> {
    let mut res = Response::new(Body::empty());
    *res.status_mut() = status;
    if let Some(after) = retry_after {
        res.headers_mut().insert(
            "retry-after",
            after
                .parse()
                .unwrap_or_else(|_| http::HeaderValue::from_static("1")),
        );
    }
    println!("    network: answered {status} without delivering");
    res
}

fn seed_from_args() -> Result<u64, String> {
    let mut args = std::env::args().skip(1);
    let mut seed = None;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--seed" => {
                let value = args.next().ok_or("--seed needs a number")?;
                seed = Some(value.parse().map_err(|e| format!("--seed: {e}"))?);
            }
            other => return Err(format!("unknown argument {other}; usage: demo [--seed N]")),
        }
    }
    Ok(seed.unwrap_or_else(|| fastrand::u64(..)))
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let seed = match seed_from_args() {
        Ok(seed) => seed,
        Err(message) => {
            eprintln!("{message}");
            return std::process::ExitCode::from(2);
        }
    };
    let ledger = app::Ledger::memory();
    let server = app::router(MemoryStore::new(), Duration::from_secs(10), ledger.clone());
    let messages: [(&str, &str, &[Fault]); 6] = [
        (
            "order-A",
            r#"{"order_id":"A","amount":500}"#,
            &[Fault::LoseAnswer, Fault::LoseAnswer, Fault::None],
        ),
        ("order-A", r#"{"order_id":"A","amount":500}"#, &[]),
        (
            "order-B",
            r#"{"order_id":"B","amount":700}"#,
            &[Fault::Unavailable],
        ),
        ("order-C", r#"{"order_id":"C","amount":-3}"#, &[]),
        (
            "order-D",
            r#"{"order_id":"D","amount":250}"#,
            &[Fault::Throttle, Fault::None],
        ),
        (
            "order-E",
            r#"{"order_id":"E","amount":900}"#,
            &[Fault::Hang],
        ),
    ];
    let scripts = messages
        .iter()
        .filter(|(_, _, script)| !script.is_empty())
        .map(|(id, _, script)| (id.to_string(), (script.to_vec(), 0)))
        .collect();
    let traffic = Arc::new(Mutex::new(Traffic::default()));
    let network = FlakyNetwork {
        server,
        scripts: Arc::new(Mutex::new(scripts)),
        traffic: traffic.clone(),
    };

    let slept = Arc::new(Mutex::new(Vec::<Duration>::new()));
    let log = slept.clone();
    let backoff = match Backoff::new(Duration::from_millis(100), 2.0, Duration::from_millis(400)) {
        Ok(backoff) => backoff,
        Err(e) => {
            eprintln!("{e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let retry = RetryLayer::new()
        // Chosen so each story ends for its own reason whatever the seed: order-B's waits add
        // up to at most 1.1 s, so it stops at the attempt limit; order-E's hung attempts
        // (900 ms each) run into the 2.5 s deadline first.
        .max_attempts(5)
        .backoff(backoff)
        .deadline(Duration::from_millis(2500))
        .rng_seed(seed)
        .classify(HttpClassifier)
        .on_retry(move |e: &RetryEvent<'_, Response<_>, _>| {
            let why = match e.outcome {
                Ok(r) => format!("{}", r.status()),
                Err(err) => format!("{err}"),
            };
            let whose = if e.from_server {
                "as the server asked"
            } else {
                "backoff with jitter"
            };
            println!(
                "    client: attempt {} failed ({why}); retrying in {} ms ({whose})",
                e.attempt,
                e.delay.as_millis()
            );
            log.lock().unwrap_or_else(|e| e.into_inner()).push(e.delay);
        })
        .into_http();
    let client = ServiceBuilder::new()
        .layer(retry.clone())
        .layer(HttpTimeoutLayer::new(Duration::from_millis(900)))
        .service(network);

    println!("tower-once demo (seed {seed}): a charge service behind a flaky network\n");
    let mut dead_letters = Vec::new();
    for (n, (id, body, _)) in messages.iter().enumerate() {
        let delivery = if messages[..n].iter().any(|(m, _, _)| m == id) {
            " (redelivered by the queue)"
        } else {
            ""
        };
        println!("{id}{delivery}: POST /charges {body}");
        let request = Request::post("http://demo/charges")
            .header("idempotency-key", *id)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from_static(body.as_bytes())));
        let Ok(request) = request else { continue };
        let started = tokio::time::Instant::now();
        match client.clone().oneshot(request).await {
            Ok(response) => {
                let status = response.status();
                let replayed = response.headers().contains_key("idempotent-replayed");
                let text = response
                    .into_body()
                    .collect()
                    .await
                    .map(|b| b.to_bytes())
                    .unwrap_or_default();
                let tag = if replayed {
                    "replayed, no new charge"
                } else if status.is_success() {
                    "charged"
                } else {
                    "final"
                };
                println!(
                    "  => {status} ({tag}) in {} ms: {}",
                    started.elapsed().as_millis(),
                    String::from_utf8_lossy(&text)
                );
                if status.is_server_error() || status == StatusCode::TOO_MANY_REQUESTS {
                    dead_letters.push(format!("{id}: gave up on {status}"));
                }
            }
            Err(error) => {
                println!(
                    "  => gave up after {} ms: {error}",
                    started.elapsed().as_millis()
                );
                dead_letters.push(format!("{id}: {error}"));
            }
        }
        println!();
    }

    let charges = ledger.charges().await.unwrap_or_default();
    let mut per_order: HashMap<String, u32> = HashMap::new();
    for charge in &charges {
        *per_order.entry(charge.order_id.clone()).or_default() += 1;
    }
    let duplicates: u32 = per_order.values().map(|n| n.saturating_sub(1)).sum();
    let stats = retry.stats();
    let traffic = traffic.lock().unwrap_or_else(|e| e.into_inner());
    let slept = slept.lock().unwrap_or_else(|e| e.into_inner());
    let delays: Vec<String> = slept
        .iter()
        .map(|d| format!("{}ms", d.as_millis()))
        .collect();

    println!("dead letters:");
    for letter in &dead_letters {
        println!("  {letter}");
    }
    println!();
    println!("{:<28} {:>6}", "logical operations", stats.operations);
    println!("{:<28} {:>6}", "attempts", stats.attempts);
    println!(
        "{:<28} {:>6}",
        "deliveries to the server", traffic.deliveries
    );
    println!("{:<28} {:>6}", "effects (charges)", charges.len());
    println!("{:<28} {:>6}", "duplicate effects", duplicates);
    println!("{:<28} {:>6}", "replays", traffic.replays);
    println!("{:<28} {:>6}", "409 conflicts", traffic.conflicts);
    println!("{:<28} {:>6}", "422 mismatches", traffic.mismatches);
    println!("{:<28} {:>6}", "gave up", stats.give_ups);
    println!("{:<28} {:>6}", "dead letters", dead_letters.len());
    println!("{:<28} {}", "delays slept", delays.join(" "));
    if duplicates == 0 {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    }
}
