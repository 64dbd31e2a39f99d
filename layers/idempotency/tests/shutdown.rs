//! Graceful shutdown waits for every background write (crate docs, `Detached`: "wait for them
//! too, after the server stopped and before the process exits"): the store writes a dropped
//! request leaves behind (a completion or a release in flight, a claim whose answer had not
//! come) are counted, so `detached().wait()` returns only once they landed, and the client's
//! retry after a deploy is a replay, never a second run. Paused time; a store whose writes
//! take 500 ms, as across a slow network.

mod support;

use http::StatusCode;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;
use support::{post, Handler};
use tokio::time::Instant;
use tower::{Layer, Service, ServiceExt};
use tower_once_idempotency::fingerprint::Fingerprint;
use tower_once_idempotency::store::{
    ClaimOutcome, ClaimToken, Completion, IdempotencyStore, MemoryStore, StoreError, StoreKey,
};
use tower_once_idempotency::IdempotencyLayer;

const SLOW: Duration = Duration::from_millis(500);

type Boxed<T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send>>;

/// A memory store whose writes land after `SLOW` (claims at once unless `slow_claims`).
#[derive(Clone)]
struct SlowWrites {
    memory: MemoryStore,
    slow_claims: bool,
}

fn later<T: Send + 'static>(
    future: impl Future<Output = Result<T, StoreError>> + Send + 'static,
) -> Boxed<T> {
    Box::pin(async move {
        tokio::time::sleep(SLOW).await;
        future.await
    })
}

impl IdempotencyStore for SlowWrites {
    type ClaimFuture = Boxed<ClaimOutcome>;
    type CompleteFuture = Boxed<bool>;
    type ReleaseFuture = Boxed<bool>;
    type ExtendFuture = <MemoryStore as IdempotencyStore>::ExtendFuture;

    fn claim(
        &self,
        key: StoreKey,
        token: ClaimToken,
        fp: Fingerprint,
        lease: Duration,
    ) -> Self::ClaimFuture {
        let memory = self.memory.clone();
        if self.slow_claims {
            later(async move { memory.claim(key, token, fp, lease).await })
        } else {
            Box::pin(async move { memory.claim(key, token, fp, lease).await })
        }
    }

    fn complete(
        &self,
        key: StoreKey,
        token: ClaimToken,
        c: Completion,
        r: Duration,
    ) -> Self::CompleteFuture {
        let memory = self.memory.clone();
        later(async move { memory.complete(key, token, c, r).await })
    }

    fn release(&self, key: StoreKey, token: ClaimToken) -> Self::ReleaseFuture {
        let memory = self.memory.clone();
        later(async move { memory.release(key, token).await })
    }

    fn extend(&self, key: StoreKey, token: ClaimToken, lease: Duration) -> Self::ExtendFuture {
        self.memory.extend(key, token, lease)
    }
}

/// Polls the request until `pending_for` has passed, then drops it: the client went away.
async fn leave_after<F: Future>(future: F, pending_for: Duration) {
    let mut future = std::pin::pin!(future);
    let left = tokio::time::timeout(pending_for, future.as_mut()).await;
    assert!(
        left.is_err(),
        "the request was still pending when its client left"
    );
}

#[tokio::test(start_paused = true)]
async fn wait_covers_a_completion_in_flight_when_its_request_is_dropped() {
    let store = SlowWrites {
        memory: MemoryStore::new(),
        slow_claims: false,
    };
    let handler = Handler::default();
    let layer = IdempotencyLayer::with_store(store);
    let detached = layer.detached();
    let mut svc = layer.layer(handler.clone());
    // The handler answers at once; the completion takes 500 ms; the client leaves at 100 ms.
    let call = svc
        .ready()
        .await
        .unwrap()
        .call(post("/charges", Some("deploy-1"), "{}"));
    leave_after(call, Duration::from_millis(100)).await;
    assert_eq!(handler.runs(), 1);

    let shutdown = Instant::now();
    detached.wait().await;
    assert!(
        shutdown.elapsed() >= Duration::from_millis(350),
        "wait() returned with the completion still in flight ({:?})",
        shutdown.elapsed()
    );
    // The process would exit here; the record is already complete: the retry is a replay.
    let retry = svc
        .ready()
        .await
        .unwrap()
        .call(post("/charges", Some("deploy-1"), "{}"))
        .await
        .unwrap();
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert!(retry.headers().contains_key("idempotent-replayed"));
    assert_eq!(handler.runs(), 1);
}

#[tokio::test(start_paused = true)]
async fn wait_covers_the_release_of_a_cancelled_request() {
    let store = SlowWrites {
        memory: MemoryStore::new(),
        slow_claims: false,
    };
    let handler = Handler::default();
    let layer = IdempotencyLayer::with_store(store).cancel_on_disconnect(true);
    let detached = layer.detached();
    let mut svc = layer.layer(handler.clone());
    let call =
        svc.ready()
            .await
            .unwrap()
            .call(post("/charges?sleep_ms=1000", Some("deploy-2"), "{}"));
    leave_after(call, Duration::from_millis(100)).await;

    let shutdown = Instant::now();
    detached.wait().await;
    assert!(
        shutdown.elapsed() >= Duration::from_millis(350),
        "wait() returned with the release still in flight ({:?})",
        shutdown.elapsed()
    );
    // Released: the retry runs at once instead of meeting a 409 for a whole lease.
    let retry = svc
        .ready()
        .await
        .unwrap()
        .call(post("/charges", Some("deploy-2"), "{}"))
        .await
        .unwrap();
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert!(!retry.headers().contains_key("idempotent-replayed"));
    assert_eq!(handler.runs(), 2, "cancelled once, run again by the retry");
}

#[tokio::test(start_paused = true)]
async fn wait_covers_a_claim_whose_request_left_before_its_answer() {
    let store = SlowWrites {
        memory: MemoryStore::new(),
        slow_claims: true,
    };
    let handler = Handler::default();
    let layer = IdempotencyLayer::with_store(store.clone());
    let detached = layer.detached();
    let mut svc = layer.layer(handler.clone());
    let call = svc
        .ready()
        .await
        .unwrap()
        .call(post("/charges", Some("deploy-3"), "{}"));
    leave_after(call, Duration::from_millis(100)).await;

    detached.wait().await;
    // The claim landed and was released again before wait() returned: nothing lands later.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(
        store.memory.is_empty(),
        "a claim landed after wait() returned"
    );
    assert_eq!(handler.runs(), 0);
}
