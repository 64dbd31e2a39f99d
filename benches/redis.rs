//! Requests per second through `IdempotencyLayer` on `RedisStore`, at 1, 16 and 64 concurrent
//! callers, for fresh keys (claim + complete: 2 round trips) and replayed keys (1 round trip),
//! beside the raw throughput of the same Lua scripts sent directly with the `redis` crate.
//! Each iteration is a batch of 64 requests; criterion reports elements (requests) per second.
//!
//! Starts its own `redis-server` on a free loopback port (or uses `REDIS_URL`).
//!
//! ```sh
//! cargo bench --bench redis --features redis
//! ```
#![allow(missing_docs)] // criterion_group! generates an undocumented pub fn

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;
use tower::{Layer, ServiceExt};
use tower_once::idempotency::store::redis::redis::{aio::ConnectionManager, Script, Value};
use tower_once::idempotency::store::redis::{RedisStore, CLAIM_SCRIPT, COMPLETE_SCRIPT};
use tower_once::idempotency::{IdempotencyLayer, RequestBody};
use tower_once_test_support::redis::RedisServer;

const BATCH: u64 = 64;
static NEXT_KEY: AtomicU64 = AtomicU64::new(0);

fn fresh_key() -> String {
    format!("bench-{}", NEXT_KEY.fetch_add(1, Relaxed))
}

/// The store's claim and complete scripts, sent directly with the arguments the store sends.
struct RawScripts {
    claim: Script,
    complete: Script,
}

impl RawScripts {
    async fn claim(&self, connection: &mut ConnectionManager, key: &str, token: u8) {
        let _: Value = self
            .claim
            .key(key)
            .arg(&[token; 16][..])
            .arg(&[1u8; 32][..])
            .arg(10_000)
            .invoke_async(connection)
            .await
            .expect("claim");
    }

    async fn complete(&self, connection: &mut ConnectionManager, key: &str, token: u8) {
        let _: i64 = self
            .complete
            .key(key)
            .arg(&[token; 16][..])
            .arg(86_400_000)
            .arg("c")
            .arg(201)
            .arg(&b"\x00"[..])
            .arg(&br#"{"id":"ch_1"}"#[..])
            .arg("")
            .invoke_async(connection)
            .await
            .expect("complete");
    }
}

/// Runs `BATCH` calls of `one` spread over `callers` concurrent tasks.
async fn batch<F, Fut>(callers: u64, one: Arc<F>)
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let tasks: Vec<_> = (0..callers)
        .map(|_| {
            let one = one.clone();
            tokio::spawn(async move {
                for _ in 0..BATCH / callers {
                    one().await;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("bench task");
    }
}

fn bench(c: &mut Criterion) {
    let server;
    let url = match std::env::var("REDIS_URL") {
        Ok(url) => url,
        Err(_) => {
            server = RedisServer::start();
            server.url()
        }
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let store = rt
        .block_on(RedisStore::connect(&url))
        .expect("valid URL")
        .key_prefix("bench:");
    let connection: ConnectionManager = store.connection().clone();
    let handler = tower::service_fn(|_req: Request<RequestBody<Full<Bytes>>>| async {
        let mut res = Response::new(Full::new(Bytes::from_static(br#"{"id":"ch_1"}"#)));
        *res.status_mut() = StatusCode::CREATED;
        Ok::<_, Infallible>(res)
    });
    let svc = IdempotencyLayer::with_store(store).layer(handler);
    let call = move |key: String| {
        let svc = svc.clone();
        async move {
            let req = Request::post("/charges")
                .header("idempotency-key", key)
                .body(Full::new(Bytes::from_static(br#"{"amount":5}"#)))
                .expect("static request");
            let res = svc.oneshot(req).await.expect("infallible");
            assert_eq!(res.status(), StatusCode::CREATED);
            res.into_body().collect().await.expect("in-memory body");
        }
    };
    rt.block_on(call("replayed".to_owned()));

    let scripts = Arc::new(RawScripts {
        claim: Script::new(CLAIM_SCRIPT),
        complete: Script::new(COMPLETE_SCRIPT),
    });
    let raw_fresh = {
        let (scripts, connection) = (scripts.clone(), connection.clone());
        move || {
            let (scripts, mut connection) = (scripts.clone(), connection.clone());
            async move {
                let key = format!("raw:{}", fresh_key());
                scripts.claim(&mut connection, &key, 7).await;
                scripts.complete(&mut connection, &key, 7).await;
            }
        }
    };
    rt.block_on(raw_fresh());
    // Complete one record once, so every later claim of it finds it.
    rt.block_on({
        let (scripts, mut connection) = (scripts.clone(), connection.clone());
        async move {
            scripts.claim(&mut connection, "raw:replayed", 7).await;
            scripts.complete(&mut connection, "raw:replayed", 7).await;
        }
    });
    let raw_replay = {
        let (scripts, connection) = (scripts.clone(), connection.clone());
        move || {
            let (scripts, mut connection) = (scripts.clone(), connection.clone());
            async move { scripts.claim(&mut connection, "raw:replayed", 8).await }
        }
    };

    let mut group = c.benchmark_group("redis");
    group.throughput(Throughput::Elements(BATCH));
    group.sample_size(20);
    group.measurement_time(Duration::from_secs(3));
    for callers in [1u64, 16, 64] {
        let layer_fresh = {
            let call = call.clone();
            Arc::new(move || call(fresh_key()))
        };
        let layer_replay = {
            let call = call.clone();
            Arc::new(move || call("replayed".to_owned()))
        };
        group.bench_function(BenchmarkId::new("layer_fresh", callers), |b| {
            b.to_async(&rt).iter(|| batch(callers, layer_fresh.clone()));
        });
        group.bench_function(BenchmarkId::new("raw_scripts_fresh", callers), |b| {
            let one = Arc::new(raw_fresh.clone());
            b.to_async(&rt).iter(|| batch(callers, one.clone()));
        });
        group.bench_function(BenchmarkId::new("layer_replay", callers), |b| {
            b.to_async(&rt)
                .iter(|| batch(callers, layer_replay.clone()));
        });
        group.bench_function(BenchmarkId::new("raw_scripts_replay", callers), |b| {
            let one = Arc::new(raw_replay.clone());
            b.to_async(&rt).iter(|| batch(callers, one.clone()));
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
