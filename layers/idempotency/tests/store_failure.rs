//! A store that fails (crate docs "What happens to a request", the row "store unreachable, slow or
//! full": `503` with `Retry-After`, or the handler run unclaimed with `fail_open`): the layer fails
//! closed and never runs a handler without a claim, unless configured to fail open; a full store
//! refuses new keys while its records are claimed. Paused time; every test counts handler runs.

use http::StatusCode;
use std::time::Duration;
use tower::Layer;
use tower_once_idempotency::fingerprint::Fingerprint;
use tower_once_idempotency::store::{
    ClaimOutcome, ClaimToken, Completion, IdempotencyStore, MemoryStore, StoreError, StoreKey,
};
use tower_once_idempotency::IdempotencyLayer;

mod support;

use support::{post, send, Handler};

/// A store that is down: every operation fails.
#[derive(Clone)]
struct DownStore;

type Failing<T> = std::future::Ready<Result<T, StoreError>>;

impl IdempotencyStore for DownStore {
    type ClaimFuture = Failing<ClaimOutcome>;
    type CompleteFuture = Failing<bool>;
    type ReleaseFuture = Failing<bool>;
    type ExtendFuture = Failing<bool>;

    fn claim(&self, _: StoreKey, _: ClaimToken, _: Fingerprint, _: Duration) -> Self::ClaimFuture {
        std::future::ready(Err(StoreError::unavailable("connection refused")))
    }
    fn complete(
        &self,
        _: StoreKey,
        _: ClaimToken,
        _: Completion,
        _: Duration,
    ) -> Self::CompleteFuture {
        std::future::ready(Err(StoreError::timeout()))
    }
    fn release(&self, _: StoreKey, _: ClaimToken) -> Self::ReleaseFuture {
        std::future::ready(Err(StoreError::timeout()))
    }
    fn extend(&self, _: StoreKey, _: ClaimToken, _: Duration) -> Self::ExtendFuture {
        std::future::ready(Err(StoreError::timeout()))
    }
}

#[tokio::test(start_paused = true)]
async fn store_failure_fails_closed_unless_configured_open() {
    let handler = Handler::default();
    let closed = IdempotencyLayer::with_store(DownStore)
        .unavailable_retry_after(Duration::from_secs(5))
        .layer(handler.clone());
    let res = send(&closed, post("/c", Some("k"), "x")).await;
    assert_eq!(res.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        res.problem_type(),
        "urn:tower-once:idempotency:store-unavailable"
    );
    assert_eq!(res.headers["retry-after"], "5");
    assert_eq!(
        handler.runs(),
        0,
        "fail-closed never runs the handler without a claim"
    );

    let open = IdempotencyLayer::with_store(DownStore)
        .fail_open(true)
        .layer(handler.clone());
    let res = send(&open, post("/c", Some("k"), "x")).await;
    assert_eq!(res.status, StatusCode::CREATED);
    assert_eq!(handler.runs(), 1, "fail-open runs it, unclaimed");
}

#[tokio::test(start_paused = true)]
async fn full_store_answers_503_and_runs_nothing() {
    let handler = Handler::default();
    let store = MemoryStore::builder().max_entries(1).build();
    let svc = IdempotencyLayer::with_store(store).layer(handler.clone());
    let holder = svc.clone();
    let running =
        tokio::spawn(async move { send(&holder, post("/c?sleep_ms=1000", Some("a"), "x")).await });
    tokio::time::sleep(Duration::from_millis(10)).await;
    let refused = send(&svc, post("/c", Some("b"), "x")).await;
    assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        handler.runs(),
        1,
        "only the request holding the one slot ran"
    );
    assert_eq!(running.await.unwrap().status, StatusCode::CREATED);
    // Now the slot holds a completed record, which a new key may evict.
    assert_eq!(
        send(&svc, post("/c", Some("b"), "x")).await.status,
        StatusCode::CREATED
    );
    assert_eq!(handler.runs(), 2);
}
