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

/// The retry sent the moment the panic reached the caller (as a client does on the `500` of a
/// `CatchPanicLayer`) runs the handler: the key's release is done before the panic goes on,
/// never left to a task the retry can overtake.
async fn a_retry_right_after_the_panic_runs_the_handler<St: IdempotencyStore>(store: St) {
    for round in 0..5 {
        let key = format!("k-panic-retry-{round}");
        let handler = Panicking::default();
        let svc = IdempotencyLayer::with_store(store.clone())
            .lease(Duration::from_secs(60))
            .layer(handler.clone());
        let first = tokio::spawn(svc.clone().oneshot(charge(&key))).await;
        assert!(first.unwrap_err().is_panic());
        let res: Response<ResponseBody<Full<Bytes>>> = svc.oneshot(charge(&key)).await.unwrap();
        assert_eq!(
            res.status(),
            StatusCode::CREATED,
            "round {round}: the key was released"
        );
        assert_eq!(handler.calls.load(SeqCst), 2);
    }
}

#[tokio::test]
async fn memory_store() {
    a_panic_is_never_polled_again_and_frees_the_key(MemoryStore::default()).await;
    a_retry_right_after_the_panic_runs_the_handler(MemoryStore::default()).await;
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn redis_store() {
    use tower_once_idempotency::store::redis::RedisStore;
    let redis = tower_once_test_support::redis::RedisServer::start();
    let store = RedisStore::connect(&redis.url()).await.unwrap();
    a_panic_is_never_polled_again_and_frees_the_key(store.clone()).await;
    a_retry_right_after_the_panic_runs_the_handler(store).await;
}

#[cfg(feature = "postgres")]
#[tokio::test]
async fn postgres_store() {
    let schema = tower_once_test_support::postgres::Schema::create();
    let store = support::postgres_store(&schema).await;
    a_panic_is_never_polled_again_and_frees_the_key(store.clone()).await;
    a_retry_right_after_the_panic_runs_the_handler(store).await;
}

/// A response body that yields its chunks, then panics (counting the polls that panicked), or
/// ends when it is not to panic.
struct PanickingBody {
    chunks: std::collections::VecDeque<Bytes>,
    panics: Option<Arc<AtomicUsize>>,
}

impl http_body::Body for PanickingBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Infallible>>> {
        if let Some(chunk) = self.chunks.pop_front() {
            return std::task::Poll::Ready(Some(Ok(http_body::Frame::data(chunk))));
        }
        match &self.panics {
            Some(panics) => {
                panics.fetch_add(1, SeqCst);
                panic!("response body bug");
            }
            None => std::task::Poll::Ready(None),
        }
    }
}

/// A handler whose first response's body yields `chunks` and then panics; later calls answer
/// `201` with a short body.
#[derive(Clone)]
struct PanickingBodyHandler {
    calls: Arc<AtomicUsize>,
    panics: Arc<AtomicUsize>,
    chunks: Vec<Bytes>,
}

impl PanickingBodyHandler {
    fn new(chunks: Vec<Bytes>) -> Self {
        Self {
            calls: Arc::default(),
            panics: Arc::default(),
            chunks,
        }
    }
}

impl Service<Req> for PanickingBodyHandler {
    type Response = Response<PanickingBody>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Response<PanickingBody>, Infallible>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Req) -> Self::Future {
        let first = self.calls.fetch_add(1, SeqCst) == 0;
        let body = if first {
            PanickingBody {
                chunks: self.chunks.iter().cloned().collect(),
                panics: Some(self.panics.clone()),
            }
        } else {
            PanickingBody {
                chunks: [Bytes::from_static(b"charged")].into(),
                panics: None,
            }
        };
        let mut res = Response::new(body);
        *res.status_mut() = if first {
            StatusCode::OK
        } else {
            StatusCode::CREATED
        };
        std::future::ready(Ok(res))
    }
}

/// Sends `key` once through `svc` on a task of its own and reads the whole answer there: whether
/// that task panicked.
async fn send_and_read<S>(svc: S, key: &str) -> Result<(StatusCode, Bytes), tokio::task::JoinError>
where
    S: Service<Request<Full<Bytes>>, Response = Response<ResponseBody<PanickingBody>>>
        + Send
        + 'static,
    S::Error: std::fmt::Debug,
    S::Future: Send,
{
    use http_body_util::BodyExt;
    let req = charge(key);
    tokio::spawn(async move {
        let res = svc.oneshot(req).await.unwrap();
        let status = res.status();
        let body = res.into_body().collect().await.unwrap().to_bytes();
        (status, body)
    })
    .await
}

/// Crate docs: "the handler panicked: ... key released; next retry runs it", and a response over
/// the store limit is "released if the body fails". The handler answered `200` with a body that
/// streams past the store limit (16 bytes) and then panics: the client got a truncated answer
/// (its connection ends with the panic), no effect was answered in full, and the retry must run
/// the handler again instead of getting the "not replayable" answer for the whole retention.
#[tokio::test]
async fn a_response_body_that_panics_past_the_store_limit_frees_the_key() {
    let handler = PanickingBodyHandler::new(vec![Bytes::from(vec![b'x'; 64])]);
    let layer = IdempotencyLayer::new().response_limit(16);
    let detached = layer.detached();
    let svc = layer.layer(handler.clone());
    let first = send_and_read(svc.clone(), "k-body-panic-streaming").await;
    assert!(
        first.unwrap_err().is_panic(),
        "the panic reaches the caller"
    );
    assert_eq!(handler.panics.load(SeqCst), 1);
    tokio::time::timeout(Duration::from_secs(10), detached.wait())
        .await
        .unwrap();
    let (status, body) = send_and_read(svc, "k-body-panic-streaming").await.unwrap();
    assert_eq!(
        (status, handler.calls.load(SeqCst)),
        (StatusCode::CREATED, 2),
        "the retry did not run the handler: {status} {body:?}"
    );
}

/// The same panic in a body within the store limit, which the layer reads itself (to store it)
/// inside the request's future: the panic reaches the caller, the body is never polled again,
/// the key is released and the retry runs the handler; whether a dropped request finishes or
/// cancels its handler. Holds; the existing test panics in the handler's future, not in the
/// body the layer reads.
#[tokio::test]
async fn a_response_body_that_panics_while_the_layer_reads_it_frees_the_key() {
    for cancel in [false, true] {
        let key = format!("k-body-panic-read-{cancel}");
        let handler = PanickingBodyHandler::new(vec![Bytes::from_static(b"part")]);
        let layer = IdempotencyLayer::new()
            .response_limit(1024)
            .cancel_on_disconnect(cancel);
        let detached = layer.detached();
        let svc = layer.layer(handler.clone());
        let first = send_and_read(svc.clone(), &key).await;
        assert!(
            first.unwrap_err().is_panic(),
            "the panic reaches the caller"
        );
        tokio::time::timeout(Duration::from_secs(10), detached.wait())
            .await
            .unwrap();
        assert_eq!(
            handler.panics.load(SeqCst),
            1,
            "polled again after its panic"
        );
        let (status, _) = send_and_read(svc, &key).await.unwrap();
        assert_eq!(status, StatusCode::CREATED, "the key was released");
        assert_eq!(handler.calls.load(SeqCst), 2, "the retry ran the handler");
    }
}
