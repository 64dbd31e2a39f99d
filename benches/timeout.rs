//! Timeout overhead on the happy path (the inner call completes at once, so the timer never
//! fires): tower-once's `TimeoutLayer` without and with an active `Deadline`, its
//! `HttpTimeoutLayer`, `tower::timeout`, and tower-resilience's time limiter, each built once,
//! outside the timed loop, over the same inner service; and `tower::timeout` beside
//! `TimeoutLayer` over an inner service whose future is 256 bytes.
//!
//! ```sh
//! cargo bench --bench timeout --features timeout
//! ```
#![allow(missing_docs)] // criterion_group! generates an undocumented pub fn

use criterion::{criterion_group, criterion_main, Criterion};
use std::convert::Infallible;
use std::time::Duration;
use tower::{Layer, Service, ServiceExt};
use tower_once::timeout::http::HttpTimeoutLayer;
use tower_once::timeout::{Deadline, TimeoutLayer};

const LIMIT: Duration = Duration::from_secs(5);

fn inner(
) -> impl Service<u64, Response = u64, Error = Infallible, Future: Send + 'static> + Clone + Send + 'static
{
    tower::service_fn(|x: u64| async move { Ok::<_, Infallible>(x + 1) })
}

/// The same, with a 256-byte response future (an HTTP client's is larger): every layer's future
/// then passes the size at which moving it is a `memcpy` call, as in real use.
fn inner_256(
) -> impl Service<u64, Response = u64, Error = Infallible, Future: Send + 'static> + Clone + Send + 'static
{
    tower::service_fn(|x: u64| {
        let state = [x as u8; 256];
        async move { Ok::<_, Infallible>(u64::from(std::hint::black_box(state)[7]) + 1) }
    })
}

async fn once<S: Service<u64, Response = u64>>(svc: S) -> u64
where
    S::Error: std::fmt::Debug,
{
    svc.oneshot(41).await.expect("happy path")
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let mut group = c.benchmark_group("timeout");
    group.measurement_time(Duration::from_secs(3));

    let bare = inner();
    group.bench_function("no_timeout", |b| {
        b.to_async(&rt).iter(|| once(bare.clone()))
    });

    let tower_timeout = tower::timeout::TimeoutLayer::new(LIMIT).layer(inner());
    group.bench_function("tower_timeout", |b| {
        b.to_async(&rt).iter(|| once(tower_timeout.clone()))
    });

    let resilience = tower_resilience::timelimiter::TimeLimiterLayer::builder()
        .timeout_duration(LIMIT)
        .build()
        .layer(inner());
    group.bench_function("tower_resilience_timelimiter", |b| {
        b.to_async(&rt).iter(|| once(resilience.clone()))
    });

    let ours = TimeoutLayer::new(LIMIT).layer(inner());
    group.bench_function("tower_once_timeout", |b| {
        b.to_async(&rt).iter(|| once(ours.clone()))
    });

    let tower_256 = tower::timeout::TimeoutLayer::new(LIMIT).layer(inner_256());
    group.bench_function("tower_timeout_256B_inner_future", |b| {
        b.to_async(&rt).iter(|| once(tower_256.clone()))
    });
    let ours_256 = TimeoutLayer::new(LIMIT).layer(inner_256());
    group.bench_function("tower_once_timeout_256B_inner_future", |b| {
        b.to_async(&rt).iter(|| once(ours_256.clone()))
    });

    // The deadline is made once (far away), so only the layer's work is timed.
    let deadline = rt.block_on(async { Deadline::after(Duration::from_secs(3600)) });
    group.bench_function("tower_once_timeout_with_deadline", |b| {
        b.to_async(&rt).iter(|| {
            let mut svc = ours.clone();
            async move {
                let call = deadline.scope(|| svc.call(41));
                call.await.expect("happy path")
            }
        })
    });

    let http_inner = tower::service_fn(|_req: http::Request<()>| async move {
        Ok::<_, Infallible>(http::Response::new(()))
    });
    let ours_http = HttpTimeoutLayer::new(LIMIT)
        .propagate_grpc_timeout()
        .layer(http_inner);
    group.bench_function("tower_once_http_timeout_grpc_header", |b| {
        b.to_async(&rt).iter(|| {
            let svc = ours_http.clone();
            async move {
                svc.oneshot(http::Request::new(()))
                    .await
                    .expect("happy path")
            }
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
