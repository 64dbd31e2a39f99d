//! Retry overhead on the happy path (the first attempt succeeds, so this is the layer's own
//! cost): tower-once's `RetryLayer` with and without its budget, its HTTP form buffering a
//! 1 KiB body, `tower::retry` with a minimal policy, and tower-resilience's retry, each built
//! once, outside the timed loop, over the same inner service.
//!
//! ```sh
//! cargo bench --bench retry --features retry
//! ```
#![allow(missing_docs)] // criterion_group! generates an undocumented pub fn

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion};
use http_body_util::Full;
use std::future::{ready, Ready};
use std::time::Duration;
use tower::{Layer, Service, ServiceExt};
use tower_once::retry::RetryLayer;

#[derive(Debug, Clone)]
struct Failed;

fn inner(
) -> impl Service<u64, Response = u64, Error = Failed, Future: Send + 'static> + Clone + Send + 'static
{
    tower::service_fn(|x: u64| async move { Ok::<_, Failed>(x + 1) })
}

/// The smallest honest tower::retry policy: retry errors up to 3 times, cloning the request.
#[derive(Clone)]
struct Attempts(usize);

impl tower::retry::Policy<u64, u64, Failed> for Attempts {
    type Future = Ready<()>;

    fn retry(&mut self, _: &mut u64, result: &mut Result<u64, Failed>) -> Option<Self::Future> {
        match result {
            Err(_) if self.0 > 0 => {
                self.0 -= 1;
                Some(ready(()))
            }
            _ => None,
        }
    }

    fn clone_request(&mut self, req: &u64) -> Option<u64> {
        Some(*req)
    }
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
    let mut group = c.benchmark_group("retry");
    group.measurement_time(Duration::from_secs(3));

    let bare = inner();
    group.bench_function("no_retry", |b| b.to_async(&rt).iter(|| once(bare.clone())));

    let tower_retry = tower::retry::RetryLayer::new(Attempts(3)).layer(inner());
    group.bench_function("tower_retry", |b| {
        b.to_async(&rt).iter(|| once(tower_retry.clone()))
    });

    let resilience = tower_resilience::retry::RetryLayer::<u64, u64, Failed>::builder()
        .max_attempts(4)
        .exponential_backoff(Duration::from_millis(500))
        .build()
        .layer(inner());
    group.bench_function("tower_resilience_retry", |b| {
        b.to_async(&rt).iter(|| once(resilience.clone()))
    });

    let ours = rt.block_on(async { RetryLayer::new().layer(inner()) });
    group.bench_function("tower_once_retry", |b| {
        b.to_async(&rt).iter(|| once(ours.clone()))
    });

    let ours_unbudgeted = rt.block_on(async { RetryLayer::new().no_budget().layer(inner()) });
    group.bench_function("tower_once_retry_no_budget", |b| {
        b.to_async(&rt).iter(|| once(ours_unbudgeted.clone()))
    });

    let body = Bytes::from(vec![b'a'; 1024]);
    let http_inner = tower::service_fn(|_req: http::Request<_>| async move {
        Ok::<_, Failed>(http::Response::new(()))
    });
    let ours_http = rt.block_on(async { RetryLayer::new().into_http().layer(http_inner) });
    group.bench_function("tower_once_http_retry_1KiB_body", |b| {
        b.to_async(&rt).iter(|| {
            let svc = ours_http.clone();
            let req = http::Request::put("/x")
                .body(Full::new(body.clone()))
                .expect("static request");
            async move { svc.oneshot(req).await.expect("happy path") }
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
