//! The facade's `metrics` feature (crate docs "Metrics": the names, types and labels of its
//! table), checked with a recording backend across the idempotency, retry, timeout, breaker,
//! fallback, hedging and step layers. One test in its own binary, as the recorder is process-global.
#![cfg(all(
    feature = "metrics",
    feature = "retry",
    feature = "breaker",
    feature = "fallback",
    feature = "hedge",
    feature = "step"
))]

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

    // Breaker: a keyed circuit opens on its first failure, then refuses.
    let failing = tower::service_fn(|_: String| async { Err::<(), _>("down") });
    let breaker = tower_once::breaker::CircuitBreakerLayer::new()
        .consecutive_failures(1)
        .key_by(|key: &String| Some(key.clone()))
        .layer(failing);
    breaker.clone().oneshot("k1".to_owned()).await.unwrap_err();
    assert!(breaker
        .oneshot("k1".to_owned())
        .await
        .unwrap_err()
        .is_circuit_open());

    // Fallback: a refused connection goes on; a reset (it may have run) is withheld.
    let io = |kind: std::io::ErrorKind| {
        tower::service_fn(move |_: u32| async move { Err::<u32, _>(std::io::Error::from(kind)) })
    };
    let secondary = tower::service_fn(|n: u32| async move { Ok::<_, std::io::Error>(n) });
    let fallback = tower_once::fallback::FallbackLayer::new(secondary);
    assert_eq!(
        fallback
            .layer(io(std::io::ErrorKind::ConnectionRefused))
            .oneshot(7)
            .await
            .unwrap(),
        7
    );
    assert!(fallback
        .layer(io(std::io::ErrorKind::ConnectionReset))
        .oneshot(7)
        .await
        .unwrap_err()
        .is_primary());

    // Hedging: a slow first copy is hedged and the hedge wins; an empty budget refuses one.
    let calls = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let slow_first = tower::service_fn(move |n: u32| {
        let first = calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0;
        async move {
            let took = if first { 1_000 } else { 1 };
            tokio::time::sleep(Duration::from_millis(took)).await;
            Ok::<_, Infallible>(n)
        }
    });
    let hedge = tower_once::hedge::HedgeLayer::new(Duration::from_millis(10)).no_budget();
    assert_eq!(hedge.layer(slow_first).oneshot(1).await.unwrap(), 1);
    let slow = tower::service_fn(|n: u32| async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        Ok::<_, Infallible>(n)
    });
    let empty = tower_once::retry::budget::RetryBudget::new(0.0, 0, Duration::from_secs(10));
    let hedge = tower_once::hedge::HedgeLayer::new(Duration::from_millis(10)).budget(empty);
    assert_eq!(hedge.layer(slow).oneshot(2).await.unwrap(), 2);

    // Durable steps: one called, its replay, one with other arguments; one waits for another.
    #[derive(Debug)]
    struct Call;
    impl tower_once::step::StepRequest for Call {}
    let tool = tower::service_fn(|Call| async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        Ok::<_, std::io::Error>(1u32)
    });
    let steps =
        tower_once::step::StepLayer::new(tower_once::idempotency::store::MemoryStore::new())
            .layer(tool);
    let step = |args: &str| {
        let id = tower_once::step::StepId::new("run-1", 1, "tool");
        tower_once::step::Step::new(id, Call).arguments(args)
    };
    let (first, waiting) = tokio::join!(steps.clone().oneshot(step("a")), async {
        tokio::time::sleep(Duration::from_millis(5)).await;
        steps.clone().oneshot(step("a")).await
    });
    assert!(!first.unwrap().is_replayed());
    assert!(waiting.unwrap().waited());
    assert!(steps
        .clone()
        .oneshot(step("b"))
        .await
        .unwrap_err()
        .is_mismatch());

    let rows = snapshot(&snapshotter);
    let expected: Vec<(String, u64)> = [
        ("tower_once_breaker_circuits{}", 1),
        ("tower_once_breaker_refusals_total{state=open}", 1),
        ("tower_once_breaker_state{circuit=k1}", 1),
        ("tower_once_breaker_transitions_total{to=open}", 1),
        ("tower_once_fallback_fallbacks_total{reason=unsent}", 1),
        ("tower_once_fallback_withheld_total{}", 1),
        ("tower_once_hedge_budget_refusals_total{}", 1),
        ("tower_once_hedge_hedges_total{}", 1),
        ("tower_once_hedge_wins_total{}", 1),
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
        ("tower_once_step_steps_total{outcome=called}", 1),
        ("tower_once_step_steps_total{outcome=mismatch}", 1),
        ("tower_once_step_steps_total{outcome=replayed}", 1),
        ("tower_once_step_waits_total{}", 1),
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
