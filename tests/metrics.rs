//! The facade's `metrics` feature (README "Observability": the names, types and labels of its
//! table), checked with a recording backend across the idempotency, retry and timeout layers. One
//! test in its own binary, as the recorder is process-global.
#![cfg(all(feature = "metrics", feature = "retry"))]

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use std::convert::Infallible;
use std::time::Duration;
use tower::{Layer, ServiceExt};
use tower_once::idempotency::{IdempotencyLayer, RequestBody};
use tower_once::retry::RetryLayer;
use tower_once::timeout::TimeoutLayer;

/// `name{labels}` -> value, for counters; histograms as their sample count.
fn snapshot(snapshotter: &metrics_util::debugging::Snapshotter) -> Vec<(String, u64)> {
    let mut rows: Vec<_> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| {
            let key = key.key();
            let mut labels: Vec<_> = key
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            labels.sort();
            let name = format!("{}{{{}}}", key.name(), labels.join(","));
            let value = match value {
                DebugValue::Counter(n) => n,
                DebugValue::Histogram(samples) => samples.len() as u64,
                DebugValue::Gauge(g) => g.into_inner() as u64,
            };
            (name, value)
        })
        .collect();
    rows.sort();
    rows
}

#[tokio::test(start_paused = true)]
async fn every_layer_reports_with_stable_names() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder
        .install()
        .expect("the only recorder in this binary");

    // Idempotency: stored, replayed, mismatch, released (503), rejected (bad key).
    let handler = tower::service_fn(|req: Request<RequestBody<Full<Bytes>>>| async move {
        let status = if req.uri().query() == Some("fail") {
            503
        } else {
            201
        };
        let mut res = Response::new(Full::new(Bytes::from_static(b"ok")));
        *res.status_mut() = StatusCode::from_u16(status).unwrap();
        Ok::<_, Infallible>(res)
    });
    let svc = IdempotencyLayer::new().layer(handler);
    for (uri, key, body) in [
        ("/c", "k", "a"),
        ("/c", "k", "a"),
        ("/c", "k", "b"),
        ("/c?fail", "k2", "a"),
        ("/c", "bad key", "a"),
    ] {
        let req = Request::post(uri)
            .header("idempotency-key", key)
            .body(Full::new(Bytes::from_static(body.as_bytes())))
            .unwrap();
        let res = svc.clone().oneshot(req).await.unwrap();
        res.into_body().collect().await.unwrap();
    }

    // Retry over a timeout: a hung upstream, 4 attempts each cut at 100 ms.
    let hung = tower::service_fn(|_: u32| std::future::pending::<Result<(), Infallible>>());
    let timed = TimeoutLayer::new(Duration::from_millis(100)).layer(hung);
    let err = RetryLayer::new()
        .no_budget()
        .layer(timed)
        .oneshot(1)
        .await
        .unwrap_err();
    assert_eq!(err.attempts(), 4);

    let rows = snapshot(&snapshotter);
    let expected: Vec<(String, u64)> = [
        ("tower_once_idempotency_requests_total{outcome=mismatch}", 1),
        ("tower_once_idempotency_requests_total{outcome=rejected}", 1),
        ("tower_once_idempotency_requests_total{outcome=released}", 1),
        ("tower_once_idempotency_requests_total{outcome=replayed}", 1),
        ("tower_once_idempotency_requests_total{outcome=stored}", 1),
        ("tower_once_retry_attempts_total{}", 4),
        ("tower_once_retry_delay_seconds{}", 3),
        ("tower_once_retry_give_ups_total{reason=exhausted}", 1),
        ("tower_once_retry_operations_total{}", 1),
        ("tower_once_retry_retries_total{}", 3),
        (
            "tower_once_timeout_timeouts_total{bound=limit,layer=timeout}",
            4,
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    assert_eq!(rows, expected);
}
