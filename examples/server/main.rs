//! The demo charge server: `POST /charges` runs once per `Idempotency-Key`.
//!
//! ```sh
//! cargo run --example server -- [--addr 127.0.0.1:3000] [--lease-ms 10000] [--redis URL | --postgres URL]
//! curl -si localhost:3000/charges -H 'Idempotency-Key: order-1' \
//!      -d '{"order_id":"A","amount":500}'
//! ```

mod app;

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;
use tower_once::idempotency::store::MemoryStore;

struct Args {
    addr: SocketAddr,
    lease: Duration,
    redis: Option<String>,
    postgres: Option<String>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        addr: SocketAddr::from(([127, 0, 0, 1], 3000)),
        lease: Duration::from_secs(10),
        redis: None,
        postgres: None,
    };
    let mut argv = std::env::args().skip(1);
    while let Some(flag) = argv.next() {
        let mut value = || argv.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--addr" => args.addr = value()?.parse().map_err(|e| format!("--addr: {e}"))?,
            "--lease-ms" => {
                let ms: u64 = value()?.parse().map_err(|e| format!("--lease-ms: {e}"))?;
                if ms < 3 {
                    return Err("--lease-ms must be at least 3".into());
                }
                args.lease = Duration::from_millis(ms);
            }
            "--redis" => args.redis = Some(value()?),
            "--postgres" => args.postgres = Some(value()?),
            "-h" | "--help" => return Err(USAGE.into()),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if args.redis.is_some() && args.postgres.is_some() {
        return Err(format!(
            "--redis and --postgres are two stores: pick one\n{USAGE}"
        ));
    }
    Ok(args)
}

const USAGE: &str = "usage: server [--addr ADDR] [--lease-ms N] [--redis URL | --postgres URL]";

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "server=info,tower_once_idempotency=warn".into()),
        )
        .init();
    // SIGTERM or SIGINT; installed before the server says it listens.
    let shutdown = tower_once::shutdown_signal();
    let args = match parse_args() {
        Ok(args) => args,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::from(2);
        }
    };
    let built = match (&args.redis, &args.postgres) {
        (Some(url), _) => redis_app(url, args.lease).await.map(|app| (app, "redis")),
        (None, Some(url)) => postgres_app(url, args.lease)
            .await
            .map(|app| (app, "postgres")),
        (None, None) => Ok((
            app::router_and_detached(MemoryStore::new(), args.lease, app::Ledger::memory()),
            "memory",
        )),
    };
    let (app, store) = match built {
        Ok(built) => built,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::from(2);
        }
    };
    let listener = match tokio::net::TcpListener::bind(args.addr).await {
        Ok(listener) => listener,
        Err(e) => {
            eprintln!("cannot listen on {}: {e}", args.addr);
            return ExitCode::FAILURE;
        }
    };
    let local = listener.local_addr().map_or(args.addr, |a| a);
    tracing::info!(target: "server", addr = %local, store, "listening");
    let (app, detached) = app;
    let served = axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await;
    // Handlers whose clients left still run: let them finish (bounded) before exiting.
    let _ = tokio::time::timeout(Duration::from_secs(30), detached.wait()).await;
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("server error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The router on a Redis store and a Redis ledger, sharing one reconnecting connection.
#[cfg(feature = "redis")]
async fn redis_app(
    url: &str,
    lease: Duration,
) -> Result<(axum::Router, tower_once::idempotency::Detached), String> {
    use tower_once::idempotency::store::redis::RedisStore;
    let store = RedisStore::connect(url)
        .await
        .map_err(|e| format!("--redis {url}: {e}"))?;
    let ledger = app::Ledger::Redis(store.connection().clone());
    Ok(app::router_and_detached(store, lease, ledger))
}

#[cfg(not(feature = "redis"))]
async fn redis_app(
    _url: &str,
    _lease: Duration,
) -> Result<(axum::Router, tower_once::idempotency::Detached), String> {
    Err("--redis needs the redis feature: cargo run --example server --features redis -- --redis URL".into())
}

/// The router on a Postgres store and a Postgres ledger: each charge commits with its record.
#[cfg(feature = "postgres")]
async fn postgres_app(
    url: &str,
    lease: Duration,
) -> Result<(axum::Router, tower_once::idempotency::Detached), String> {
    let ledger = app::postgres_ledger(url).await?;
    let app::Ledger::Postgres(store) = ledger.clone() else {
        return Err("a Postgres ledger".into());
    };
    Ok(app::router_and_detached(store, lease, ledger))
}

#[cfg(not(feature = "postgres"))]
async fn postgres_app(
    _url: &str,
    _lease: Duration,
) -> Result<(axum::Router, tower_once::idempotency::Detached), String> {
    Err("--postgres needs the postgres feature: cargo run --example server --features postgres -- --postgres URL".into())
}
