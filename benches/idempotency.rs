//! IdempotencyLayer overhead on an axum router, in process (no sockets): a fresh key (claim, run,
//! store), a replayed key (claim finds the record; the handler does not run), and the same router
//! without the layer. Each router is built once, outside the timed loop.
//!
//! ```sh
//! cargo bench --bench idempotency
//! ```

#![allow(missing_docs)] // criterion_group! generates an undocumented pub fn

use axum::body::{Body, Bytes};
use axum::routing::post;
use axum::Router;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;
use tower::ServiceExt;
use tower_once::idempotency::IdempotencyLayer;

/// A handler that reads the whole body and answers a small JSON document, like a create endpoint.
async fn create(body: Bytes) -> (StatusCode, [(&'static str, &'static str); 1], String) {
    (
        StatusCode::CREATED,
        [("content-type", "application/json")],
        format!(r#"{{"id":"ch_1","received":{}}}"#, body.len()),
    )
}

fn request(key: &str, body: &Bytes) -> Request<Body> {
    Request::post("/charges")
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(Body::from(body.clone()))
        .expect("static request parts are valid")
}

async fn call(router: Router, req: Request<Body>) -> usize {
    let res = ServiceExt::<Request<Body>>::oneshot(router, req)
        .await
        .expect("router is infallible");
    assert!(res.status().is_success());
    let body = res.into_body().collect().await.expect("in-memory body");
    body.to_bytes().len()
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let mut group = c.benchmark_group("idempotency");
    group.measurement_time(Duration::from_secs(4));

    for size in [1024usize, 64 * 1024] {
        let body = Bytes::from(vec![b'a'; size]);
        let label = format!("{}KiB", size / 1024);
        group.throughput(Throughput::Bytes(size as u64));

        let plain = Router::new().route("/charges", post(create));
        let layered = Router::new()
            .route("/charges", post(create))
            .layer(IdempotencyLayer::new());

        group.bench_with_input(
            BenchmarkId::new("without_layer", &label),
            &body,
            |b, body| {
                b.to_async(&rt)
                    .iter(|| call(plain.clone(), request("k", body)));
            },
        );

        let counter = AtomicU64::new(0);
        group.bench_with_input(BenchmarkId::new("fresh_key", &label), &body, |b, body| {
            b.to_async(&rt).iter(|| {
                let key = format!("fresh-{}", counter.fetch_add(1, Relaxed));
                call(layered.clone(), request(&key, body))
            });
        });

        rt.block_on(call(layered.clone(), request("replayed", &body)));
        group.bench_with_input(
            BenchmarkId::new("replayed_key", &label),
            &body,
            |b, body| {
                b.to_async(&rt)
                    .iter(|| call(layered.clone(), request("replayed", body)));
            },
        );
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
