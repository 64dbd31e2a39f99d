//! Attacks on "a panicking handler's key is released, and the release awaited, before the panic
//! goes on" (crate docs, the "panicked" row): a retry sent the moment the panic is reported runs
//! the handler.

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;
use tower::{Layer, Service, ServiceExt};
use tower_once_idempotency::store::{IdempotencyStore, MemoryStore};
use tower_once_idempotency::{IdempotencyLayer, RequestBody, ResponseBody};

mod support;

type Req = Request<RequestBody<Full<Bytes>>>;
type BoxFut = Pin<Box<dyn Future<Output = Result<Response<Full<Bytes>>, Infallible>> + Send>>;

fn charge(key: &str) -> Request<Full<Bytes>> {
    support::post("/charges", Some(key), "{}")
}

fn created() -> BoxFut {
    Box::pin(async {
        Ok(Response::builder()
            .status(StatusCode::CREATED)
            .body(Full::new(Bytes::from_static(b"charged")))
            .unwrap())
    })
}

/// A handler whose first `call` panics synchronously (a bug before its future exists: a
/// failed `unwrap` on a header, an index out of range); later calls answer `201`.
#[derive(Clone, Default)]
struct PanicsInCall {
    calls: Arc<AtomicUsize>,
}

impl Service<Req> for PanicsInCall {
    type Response = Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = BoxFut;

    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Req) -> BoxFut {
        if self.calls.fetch_add(1, SeqCst) == 0 {
            panic!("handler bug in call");
        }
        created()
    }
}

/// The handler panicked (in its `call`): the retry sent the moment the panic reached the caller
/// runs the handler (`201`), as the crate docs promise for a panicking handler.
async fn a_retry_right_after_a_panic_in_call_runs_the_handler<St: IdempotencyStore>(store: St) {
    for round in 0..5 {
        let key = format!("k-call-panic-{round}");
        let handler = PanicsInCall::default();
        let svc = IdempotencyLayer::with_store(store.clone())
            .lease(Duration::from_secs(60))
            .layer(handler.clone());
        let first = tokio::spawn(svc.clone().oneshot(charge(&key))).await;
        assert!(first.unwrap_err().is_panic(), "the panic reaches the caller");
        let res: Response<ResponseBody<Full<Bytes>>> = svc.oneshot(charge(&key)).await.unwrap();
        assert_eq!(
            res.status(),
            StatusCode::CREATED,
            "round {round}: a retry right after a panic in the handler's call met the key still held"
        );
        assert_eq!(handler.calls.load(SeqCst), 2);
    }
}

#[tokio::test]
async fn panic_in_call_memory_store() {
    a_retry_right_after_a_panic_in_call_runs_the_handler(MemoryStore::default()).await;
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn panic_in_call_redis_store() {
    use tower_once_idempotency::store::redis::RedisStore;
    let redis = tower_once_test_support::redis::RedisServer::start();
    let store = RedisStore::connect(&redis.url()).await.unwrap();
    a_retry_right_after_a_panic_in_call_runs_the_handler(store).await;
}

#[cfg(feature = "postgres")]
#[tokio::test]
async fn panic_in_call_postgres_store() {
    let schema = tower_once_test_support::postgres::Schema::create();
    let store = support::postgres_store(&schema).await;
    a_retry_right_after_a_panic_in_call_runs_the_handler(store).await;
}

#[cfg(feature = "postgres")]
#[tokio::test]
async fn panic_in_call_postgres_transactional_store() {
    let schema = tower_once_test_support::postgres::Schema::create();
    let store = support::postgres_store(&schema).await.transactional();
    a_retry_right_after_a_panic_in_call_runs_the_handler(store).await;
}
