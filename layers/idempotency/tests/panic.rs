//! A handler that panics (crate docs "What happens to a request": a panic in the handler): the
//! panic reaches the caller, the panicked future is never polled again (not even when the
//! request is dropped during the unwind, which otherwise finishes a handler on a task of its
//! own), and the key is released so that the client's retry runs the handler again. On every
//! store: memory, Redis and Postgres.

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;
use tower::{Layer, Service, ServiceExt};
use tower_once_idempotency::store::{IdempotencyStore, MemoryStore};
use tower_once_idempotency::{IdempotencyLayer, RequestBody, ResponseBody};

mod support;

type Req = Request<RequestBody<Full<Bytes>>>;

/// A handler whose first call panics when polled (counting its polls), and whose later calls
/// answer `201`.
#[derive(Clone, Default)]
struct Panicking {
    calls: Arc<AtomicUsize>,
    panicked_polls: Arc<AtomicUsize>,
}

impl Service<Req> for Panicking {
    type Response = Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, Infallible>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Req) -> Self::Future {
        if self.calls.fetch_add(1, SeqCst) == 0 {
            let polls = self.panicked_polls.clone();
            // NOTE: a hand-written future, not an `async` block: polled again after its panic,
            // it counts that poll instead of failing with "resumed after panicking".
            return Box::pin(std::future::poll_fn(move |_| {
                polls.fetch_add(1, SeqCst);
                panic!("handler bug");
            }));
        }
        Box::pin(async {
            Ok(Response::builder()
                .status(StatusCode::CREATED)
                .body(Full::new(Bytes::from_static(b"charged")))
                .unwrap())
        })
    }
}

fn charge(key: &str) -> Request<Full<Bytes>> {
    support::post("/charges", Some(key), "{}")
}

/// The panic reaches the caller's task, the handler is polled once, and the retry (once the
/// release landed) runs the handler again and is answered `201`; whether a dropped request
/// finishes its handler or cancels it.
async fn a_panic_is_never_polled_again_and_frees_the_key<St: IdempotencyStore>(store: St) {
    for cancel in [false, true] {
        let key = format!("k-panic-{cancel}");
        let handler = Panicking::default();
        let layer = IdempotencyLayer::with_store(store.clone())
            .lease(Duration::from_secs(60))
            .cancel_on_disconnect(cancel);
        let detached = layer.detached();
        let svc = layer.layer(handler.clone());
        let first = tokio::spawn(svc.clone().oneshot(charge(&key))).await;
        assert!(
            first.unwrap_err().is_panic(),
            "the panic reaches the caller"
        );
        tokio::time::timeout(Duration::from_secs(10), detached.wait())
            .await
            .unwrap();
        assert_eq!(
            handler.panicked_polls.load(SeqCst),
            1,
            "a panicked handler was polled again (cancel_on_disconnect {cancel})"
        );
        let res: Response<ResponseBody<Full<Bytes>>> = svc.oneshot(charge(&key)).await.unwrap();
        assert_eq!(res.status(), StatusCode::CREATED, "the key was released");
        assert_eq!(handler.calls.load(SeqCst), 2, "the retry ran the handler");
    }
}

#[tokio::test]
async fn memory_store() {
    a_panic_is_never_polled_again_and_frees_the_key(MemoryStore::default()).await;
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn redis_store() {
    use tower_once_idempotency::store::redis::RedisStore;
    let redis = tower_once_test_support::redis::RedisServer::start();
    let store = RedisStore::connect(&redis.url()).await.unwrap();
    a_panic_is_never_polled_again_and_frees_the_key(store).await;
}

#[cfg(feature = "postgres")]
#[tokio::test]
async fn postgres_store() {
    let schema = tower_once_test_support::postgres::Schema::create();
    let store = support::postgres_store(&schema).await;
    a_panic_is_never_polled_again_and_frees_the_key(store).await;
}
