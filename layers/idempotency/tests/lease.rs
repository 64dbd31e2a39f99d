//! Leases (crate docs "Crashes and leases", and the row "same key, same request, still running":
//! `409` with a `Retry-After` of the lease left, at most 1 s): a running handler holds its key as
//! long as it runs by renewing its lease, a duplicate meanwhile gets `409`, a crashed owner's key
//! is free again after one lease, and no lease or retention is too long. Paused time; every test
//! counts handler runs.

use http::StatusCode;
use std::time::Duration;
use tower::{Layer, Service, ServiceExt};
use tower_once_idempotency::IdempotencyLayer;

mod support;

use support::{post, send, Handler};

#[tokio::test(start_paused = true)]
async fn duplicate_while_running_is_409_with_retry_after() {
    let handler = Handler::default();
    let svc = IdempotencyLayer::new()
        .lease(Duration::from_secs(10))
        .layer(handler.clone());

    let first_svc = svc.clone();
    let first =
        tokio::spawn(
            async move { send(&first_svc, post("/c?sleep_ms=5000", Some("k"), "x")).await },
        );
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(handler.runs(), 1);

    let dup = send(&svc, post("/c?sleep_ms=5000", Some("k"), "x")).await;
    assert_eq!(dup.status, StatusCode::CONFLICT);
    assert_eq!(dup.problem_type(), "urn:tower-once:idempotency:in-progress");
    assert_eq!(
        dup.headers["retry-after"], "1",
        "a short hint (default 1 s), not the 10 s lease"
    );
    assert_eq!(handler.runs(), 1, "the duplicate did not run");

    let first = first.await.unwrap();
    assert_eq!(first.status, StatusCode::CREATED);
    let after = send(&svc, post("/c?sleep_ms=5000", Some("k"), "x")).await;
    assert!(after.replayed());
    assert_eq!(handler.runs(), 1);
}

#[tokio::test(start_paused = true)]
async fn the_in_progress_hint_is_configurable_and_capped_by_the_lease() {
    let handler = Handler::default();
    for (lease, hint, expected) in [(30, 3, "3"), (2, 60, "2")] {
        let svc = IdempotencyLayer::new()
            .lease(Duration::from_secs(lease))
            .in_progress_retry_after(Duration::from_secs(hint))
            .layer(handler.clone());
        let first = svc.clone();
        let key = format!("k{lease}");
        let running = {
            let key = key.clone();
            tokio::spawn(
                async move { send(&first, post("/c?sleep_ms=500", Some(&key), "x")).await },
            )
        };
        tokio::task::yield_now().await;
        let dup = send(&svc, post("/c?sleep_ms=500", Some(&key), "x")).await;
        assert_eq!(dup.status, StatusCode::CONFLICT);
        assert_eq!(
            dup.headers["retry-after"], expected,
            "lease {lease} s, hint {hint} s"
        );
        running.await.unwrap();
    }
    assert_eq!(handler.runs(), 2);
}

#[tokio::test(start_paused = true)]
async fn slow_handler_keeps_its_claim_by_renewing_the_lease() {
    let handler = Handler::default();
    let svc = IdempotencyLayer::new()
        .lease(Duration::from_secs(3))
        .layer(handler.clone());

    let first_svc = svc.clone();
    let first =
        tokio::spawn(
            async move { send(&first_svc, post("/c?sleep_ms=20000", Some("k"), "x")).await },
        );
    // Well past several leases: without renewal the key would be free by now.
    tokio::time::sleep(Duration::from_secs(15)).await;
    let dup = send(&svc, post("/c?sleep_ms=20000", Some("k"), "x")).await;
    assert_eq!(dup.status, StatusCode::CONFLICT);
    assert_eq!(handler.runs(), 1);

    assert_eq!(first.await.unwrap().status, StatusCode::CREATED);
    assert!(send(&svc, post("/c?sleep_ms=20000", Some("k"), "x"))
        .await
        .replayed());
    assert_eq!(handler.runs(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_crashed_owner_frees_the_key_after_one_lease() {
    let handler = Handler::default();
    let lease = Duration::from_secs(10);
    let mut svc = IdempotencyLayer::new().lease(lease).layer(handler.clone());
    // A "crash": the request's future is never polled again and never dropped, so it neither
    // renews nor releases its claim.
    let mut crashed = Box::pin(svc.ready().await.unwrap().call(post(
        "/c?sleep_ms=600000",
        Some("k"),
        "x",
    )));
    assert!(futures_util::poll!(crashed.as_mut()).is_pending());
    std::mem::forget(crashed);
    assert_eq!(handler.runs(), 1);

    tokio::time::advance(lease / 2).await;
    let early = send(&svc, post("/c?sleep_ms=600000", Some("k"), "x")).await;
    assert_eq!(
        early.status,
        StatusCode::CONFLICT,
        "within the lease the key is held"
    );
    assert_eq!(handler.runs(), 1);

    tokio::time::advance(lease).await;
    let late = send(&svc, post("/c?sleep_ms=600000", Some("k"), "x")).await;
    assert_eq!(
        late.status,
        StatusCode::CREATED,
        "after the lease the retry runs"
    );
    assert_eq!(handler.runs(), 2);
}

#[tokio::test(start_paused = true)]
async fn huge_lease_and_retention_do_not_panic() {
    let handler = Handler::default();
    let svc = IdempotencyLayer::new()
        .lease(Duration::MAX)
        .retention(Duration::MAX)
        .layer(handler.clone());
    assert_eq!(
        send(&svc, post("/c", Some("k"), "x")).await.status,
        StatusCode::CREATED
    );
    assert!(send(&svc, post("/c", Some("k"), "x")).await.replayed());
    assert_eq!(handler.runs(), 1);
}
