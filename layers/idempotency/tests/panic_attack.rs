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

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
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
        let key = format!("k-call-panic-{round}-{}", uuid_ish());
        let handler = PanicsInCall::default();
        let svc = IdempotencyLayer::with_store(store.clone())
            .lease(Duration::from_secs(60))
            .layer(handler.clone());
        let first = tokio::spawn(svc.clone().oneshot(charge(&key))).await;
        assert!(
            first.unwrap_err().is_panic(),
            "the panic reaches the caller"
        );
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
    for _ in 0..4 {
        a_retry_right_after_a_panic_in_call_runs_the_handler(store.clone()).await;
    }
}

/// A handler whose first future waits for `go`, then panics with `payload`; later calls
/// answer `201`.
#[derive(Clone)]
struct PanicsOnGo {
    calls: Arc<AtomicUsize>,
    started: Arc<tokio::sync::Notify>,
    go: Arc<tokio::sync::Notify>,
}

impl PanicsOnGo {
    fn new() -> Self {
        Self {
            calls: Arc::default(),
            started: Arc::default(),
            go: Arc::default(),
        }
    }
}

impl Service<Req> for PanicsOnGo {
    type Response = Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = BoxFut;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Req) -> BoxFut {
        if self.calls.fetch_add(1, SeqCst) == 0 {
            let (started, go) = (self.started.clone(), self.go.clone());
            return Box::pin(async move {
                started.notify_one();
                go.notified().await;
                // Not a `&str` nor a `String`.
                std::panic::panic_any(42u32)
            });
        }
        created()
    }
}

/// Redis frozen (SIGSTOP) when the handler panics: the release the layer now waits for cannot
/// land, yet the panic reaches the caller within the store's command timeout (1 s; 10 s
/// allowed), with its payload (a `u32`) intact. Then, whether the request was left to finish or
/// dropped mid-release (`cancel_on_disconnect` either way): once Redis thaws and the detached
/// work is done, the retry runs the handler.
#[cfg(feature = "redis")]
#[tokio::test]
async fn redis_frozen_during_the_release_the_panic_still_reaches_the_caller() {
    use tower_once_idempotency::store::redis::RedisStore;
    let redis = tower_once_test_support::redis::RedisServer::start();
    let store = RedisStore::connect(&redis.url()).await.unwrap();
    for (drop_mid_release, cancel) in [(false, false), (true, false), (true, true)] {
        let key = format!("k-frozen-{drop_mid_release}-{cancel}");
        let handler = PanicsOnGo::new();
        let layer = IdempotencyLayer::with_store(store.clone())
            .lease(Duration::from_secs(3))
            .cancel_on_disconnect(cancel);
        let detached = layer.detached();
        let svc = layer.layer(handler.clone());
        let first = tokio::spawn(svc.clone().oneshot(charge(&key)));
        handler.started.notified().await;
        redis.signal("-STOP");
        handler.go.notify_one();
        if drop_mid_release {
            tokio::time::sleep(Duration::from_millis(200)).await;
            first.abort();
            let _ = first.await;
        } else {
            let outcome = tokio::time::timeout(Duration::from_secs(10), first).await;
            redis.signal("-CONT");
            let panic = outcome
                .expect("the panic never reached the caller while Redis was frozen")
                .unwrap_err()
                .into_panic();
            assert_eq!(
                panic.downcast_ref::<u32>(),
                Some(&42),
                "the payload went on intact"
            );
        }
        redis.signal("-CONT");
        tokio::time::timeout(Duration::from_secs(20), detached.wait())
            .await
            .expect("detached work never ended");
        // The release may have been lost to the freeze: the 3 s lease frees the key anyway.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let res: Response<ResponseBody<Full<Bytes>>> =
                svc.clone().oneshot(charge(&key)).await.unwrap();
            if res.status() == StatusCode::CREATED {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "({drop_mid_release}, {cancel}): the key stayed held: {}",
                res.status()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(handler.calls.load(SeqCst), 2);
    }
}

/// Two `IdempotencyLayer`s nested under axum (an app-wide layer around a nested router with
/// its own): the handler's panic releases both keys before it reaches the caller, so the retry
/// sent at once runs the handler.
#[tokio::test]
async fn nested_layers_release_both_keys_before_the_panic_goes_on() {
    use axum::{routing::post, Router};
    for round in 0..3 {
        let key = format!("k-nested-{round}");
        let calls = Arc::new(AtomicUsize::new(0));
        let counted = calls.clone();
        let api = Router::new()
            .route(
                "/charges",
                post(move || {
                    let calls = counted.clone();
                    async move {
                        if calls.fetch_add(1, SeqCst) == 0 {
                            std::panic::panic_any(42u32);
                        }
                        (StatusCode::CREATED, "charged")
                    }
                }),
            )
            .layer(IdempotencyLayer::new().lease(Duration::from_secs(60)));
        let app = Router::new()
            .nest("/api", api)
            .layer(IdempotencyLayer::new().lease(Duration::from_secs(60)));
        let req = support::post("/api/charges", Some(&key), "{}");
        let first = tokio::spawn(app.clone().oneshot(req)).await;
        let panic = first.unwrap_err().into_panic();
        assert_eq!(panic.downcast_ref::<u32>(), Some(&42));
        let req = support::post("/api/charges", Some(&key), "{}");
        let res = app.oneshot(req).await.unwrap();
        assert_eq!(res.status(), StatusCode::CREATED, "round {round}");
        assert_eq!(calls.load(SeqCst), 2);
    }
}

/// Postgres blocks the release (another session holds the key table locked) when the handler
/// panics: the release the layer now waits for cannot land, yet the panic reaches the caller
/// within the store's statement timeout (1 s; 10 s allowed), payload intact. Once the lock goes,
/// the retry runs the handler (at the latest when the 3 s lease ends).
#[cfg(feature = "postgres")]
#[tokio::test]
async fn postgres_blocked_during_the_release_the_panic_still_reaches_the_caller() {
    use tower_once_idempotency::store::postgres::sqlx::{self, Connection, Executor};
    let schema = tower_once_test_support::postgres::Schema::create();
    let store = support::postgres_store(&schema).await;
    let handler = PanicsOnGo::new();
    let layer = IdempotencyLayer::with_store(store).lease(Duration::from_secs(3));
    let detached = layer.detached();
    let svc = layer.layer(handler.clone());
    let first = tokio::spawn(svc.clone().oneshot(charge("k-pg-blocked")));
    handler.started.notified().await;
    let mut locker =
        sqlx::PgConnection::connect(&tower_once_test_support::postgres::database_url())
            .await
            .unwrap();
    locker.execute("BEGIN").await.unwrap();
    locker
        .execute(format!("LOCK TABLE {}.idem IN ACCESS EXCLUSIVE MODE", schema.name).as_str())
        .await
        .unwrap();
    handler.go.notify_one();
    let outcome = tokio::time::timeout(Duration::from_secs(10), first).await;
    locker.execute("ROLLBACK").await.unwrap();
    let panic = outcome
        .expect("the panic never reached the caller while the release was blocked")
        .unwrap_err()
        .into_panic();
    assert_eq!(panic.downcast_ref::<u32>(), Some(&42));
    tokio::time::timeout(Duration::from_secs(20), detached.wait())
        .await
        .expect("detached work never ended");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let res: Response<ResponseBody<Full<Bytes>>> =
            svc.clone().oneshot(charge("k-pg-blocked")).await.unwrap();
        if res.status() == StatusCode::CREATED {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "key stayed held: {}",
            res.status()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The panic in `call` on the memory store, on a multi-threaded runtime (as servers run): the
/// background release and the retry's claim race on two threads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn panic_in_call_memory_store_multi_thread() {
    for _ in 0..10 {
        a_retry_right_after_a_panic_in_call_runs_the_handler(MemoryStore::default()).await;
    }
}

/// The panic in `call` on the transactional Postgres store, on a multi-threaded runtime.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn panic_in_call_postgres_transactional_store_multi_thread() {
    let schema = tower_once_test_support::postgres::Schema::create();
    let store = support::postgres_store(&schema).await.transactional();
    for _ in 0..4 {
        a_retry_right_after_a_panic_in_call_runs_the_handler(store.clone()).await;
    }
}

/// A key of its own per call of the scenario.
fn uuid_ish() -> usize {
    static N: AtomicUsize = AtomicUsize::new(0);
    N.fetch_add(1, SeqCst)
}

/// The client went away while the handler ran (`cancel_on_disconnect(false)`: the handler goes
/// on on a detached task), and the handler then panics there: the detached work ends (the panic
/// is the task's), and once `detached.wait()` returns the key is free: the retry runs the
/// handler at once. Postgres store.
#[cfg(feature = "postgres")]
#[tokio::test]
async fn a_detached_handler_that_panics_frees_the_key_before_the_wait_returns() {
    let schema = tower_once_test_support::postgres::Schema::create();
    let store = support::postgres_store(&schema).await;
    for round in 0..5 {
        let key = format!("k-detached-panic-{round}");
        let handler = PanicsOnGo::new();
        let layer = IdempotencyLayer::with_store(store.clone())
            .lease(Duration::from_secs(60))
            .cancel_on_disconnect(false);
        let detached = layer.detached();
        let svc = layer.layer(handler.clone());
        let first = tokio::spawn(svc.clone().oneshot(charge(&key)));
        handler.started.notified().await;
        first.abort();
        let _ = first.await;
        handler.go.notify_one();
        tokio::time::timeout(Duration::from_secs(10), detached.wait())
            .await
            .expect("the detached handler's work never ended");
        let res: Response<ResponseBody<Full<Bytes>>> = svc.oneshot(charge(&key)).await.unwrap();
        assert_eq!(
            res.status(),
            StatusCode::CREATED,
            "round {round}: key still held"
        );
        assert_eq!(handler.calls.load(SeqCst), 2);
    }
}
