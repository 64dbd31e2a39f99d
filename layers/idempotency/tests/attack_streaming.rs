//! Attacks on over-limit (streaming) responses and on disconnects (guarantees 2 and 6).

use bytes::Bytes;
use futures_util::StreamExt;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody};
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;
use tower::{Layer, ServiceExt};
use tower_once_idempotency::store::MemoryStore;
use tower_once_idempotency::{IdempotencyLayer, RequestBody};

type Frames = futures_util::stream::BoxStream<'static, Result<http_body::Frame<Bytes>, Infallible>>;

/// A handler that answers an SSE-like body: 64 bytes now, then nothing for ever (an idle
/// stream), counting runs.
fn sse(
    runs: Arc<AtomicUsize>,
) -> impl tower::Service<
    Request<RequestBody<Full<Bytes>>>,
    Response = Response<StreamBody<Frames>>,
    Error = Infallible,
    Future = impl Send,
> + Clone
       + Send
       + 'static {
    tower::service_fn(move |_req: Request<RequestBody<Full<Bytes>>>| {
        runs.fetch_add(1, SeqCst);
        async move {
            let first =
                futures_util::stream::iter([Ok(http_body::Frame::data(Bytes::from(vec![
                    b'x';
                    64
                ])))]);
            let frames: Frames = first.chain(futures_util::stream::pending()).boxed();
            Ok::<_, Infallible>(Response::new(StreamBody::new(frames)))
        }
    })
}

fn post() -> Request<Full<Bytes>> {
    Request::post("/events")
        .header("idempotency-key", "k")
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap()
}

/// Was a break found by the attack, now fixed. A response over the store limit is "kept claimed (renewed) while streaming", but the
/// renewal only happens inside `ResponseBody::poll_frame` (body.rs, `held.poll_renew`). A client
/// that stops reading without leaving (hyper does not poll a body while the socket's send
/// buffer is full; HTTP/2 flow control likewise) leaves the body unpolled: the lease lapses
/// while the first response is still being delivered, and a duplicate runs the handler again.
#[tokio::test(start_paused = true)]
async fn an_unread_streaming_body_keeps_its_claim() {
    let runs = Arc::new(AtomicUsize::new(0));
    let svc = IdempotencyLayer::with_store(MemoryStore::new())
        .response_limit(16)
        .layer(sse(runs.clone()));
    let res = svc.clone().oneshot(post()).await.unwrap();
    let mut body = res.into_body();
    let first = body.frame().await.unwrap().unwrap();
    assert_eq!(first.into_data().unwrap().len(), 64);
    // The client is slow: it does not read for 30 s (3 leases) but is still connected.
    tokio::time::sleep(Duration::from_secs(30)).await;
    let dup = svc.clone().oneshot(post()).await.unwrap();
    assert_eq!(
        (runs.load(SeqCst), dup.status()),
        (1, StatusCode::CONFLICT),
        "the stream is still being delivered, yet the duplicate ran the handler"
    );
    drop(body);
}

/// HOLDS (control): the same stream, read by the client (idle between events): the renew timer
/// wakes the reader's task, the lease is renewed, the duplicate gets 409.
#[tokio::test(start_paused = true)]
async fn a_read_streaming_body_keeps_its_claim() {
    let runs = Arc::new(AtomicUsize::new(0));
    let svc = IdempotencyLayer::with_store(MemoryStore::new())
        .response_limit(16)
        .layer(sse(runs.clone()));
    let res = svc.clone().oneshot(post()).await.unwrap();
    let mut body = res.into_body();
    let reader = tokio::spawn(async move { while let Some(Ok(_)) = body.frame().await {} });
    tokio::time::sleep(Duration::from_secs(30)).await;
    let dup = svc.clone().oneshot(post()).await.unwrap();
    assert_eq!((runs.load(SeqCst), dup.status()), (1, StatusCode::CONFLICT));
    reader.abort();
}

/// HOLDS: the client stops reading by dropping the body mid-stream: not replayable, the
/// duplicate never runs the handler, even after the lease.
#[tokio::test(start_paused = true)]
async fn a_dropped_streaming_body_is_not_replayable() {
    let runs = Arc::new(AtomicUsize::new(0));
    let svc = IdempotencyLayer::with_store(MemoryStore::new())
        .response_limit(16)
        .layer(sse(runs.clone()));
    let res = svc.clone().oneshot(post()).await.unwrap();
    let mut body = res.into_body();
    body.frame().await.unwrap().unwrap();
    drop(body);
    tokio::time::sleep(Duration::from_secs(30)).await;
    let dup = svc.clone().oneshot(post()).await.unwrap();
    assert_eq!(runs.load(SeqCst), 1);
    assert!(dup.status().is_client_error(), "{}", dup.status());
}

/// HOLDS: the response future is dropped (client gone, or `tower::timeout` around the layer)
/// while the handler runs; the handler finishes on its own task and the retry is replayed.
#[tokio::test(start_paused = true)]
async fn timeout_around_the_layer_still_stores_the_response() {
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let slow = tower::service_fn(move |_req: Request<RequestBody<Full<Bytes>>>| {
        let counted = counted.clone();
        async move {
            tokio::time::sleep(Duration::from_secs(25)).await; // longer than the lease
            counted.fetch_add(1, SeqCst);
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"charged"))))
        }
    });
    let svc = IdempotencyLayer::with_store(MemoryStore::new()).layer(slow);
    let timed = tower::timeout::TimeoutLayer::new(Duration::from_secs(1)).layer(svc.clone());
    assert!(timed.oneshot(post()).await.is_err());
    tokio::time::sleep(Duration::from_secs(60)).await;
    let retry = svc.oneshot(post()).await.unwrap();
    assert_eq!(runs.load(SeqCst), 1);
    assert!(retry.headers().contains_key("idempotent-replayed"));
}

/// HOLDS: `cancel_on_disconnect(true)`: the response future dropped mid-handler drops the
/// handler and releases the key; the retry runs the handler afresh.
#[tokio::test(start_paused = true)]
async fn cancel_on_disconnect_drops_and_releases() {
    let (started, finished) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (s, f) = (started.clone(), finished.clone());
    let slow = tower::service_fn(move |_req: Request<RequestBody<Full<Bytes>>>| {
        let (s, f) = (s.clone(), f.clone());
        async move {
            s.fetch_add(1, SeqCst);
            tokio::time::sleep(Duration::from_secs(5)).await;
            f.fetch_add(1, SeqCst);
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"done"))))
        }
    });
    let svc = IdempotencyLayer::with_store(MemoryStore::new())
        .cancel_on_disconnect(true)
        .layer(slow);
    let timed = tower::timeout::TimeoutLayer::new(Duration::from_secs(1)).layer(svc.clone());
    assert!(timed.oneshot(post()).await.is_err());
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(finished.load(SeqCst), 0, "the handler was dropped");
    let retry = svc.oneshot(post()).await.unwrap();
    assert_eq!(retry.status(), StatusCode::OK);
    assert!(!retry.headers().contains_key("idempotent-replayed"));
    assert_eq!((started.load(SeqCst), finished.load(SeqCst)), (2, 1));
}

/// HOLDS: a handler that panics on its detached task (the client left): the claim is released
/// by the guard's drop, the retry runs (no key held for a lease, no panic reaching the caller).
#[tokio::test(start_paused = true)]
async fn a_detached_handler_that_panics_releases_the_key() {
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let svc = tower::service_fn(move |_req: Request<RequestBody<Full<Bytes>>>| {
        let n = counted.fetch_add(1, SeqCst);
        async move {
            tokio::time::sleep(Duration::from_secs(2)).await;
            if n == 0 {
                panic!("handler bug");
            }
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"done"))))
        }
    });
    let svc = IdempotencyLayer::with_store(MemoryStore::new()).layer(svc);
    let timed = tower::timeout::TimeoutLayer::new(Duration::from_secs(1)).layer(svc.clone());
    assert!(timed.oneshot(post()).await.is_err());
    tokio::time::sleep(Duration::from_secs(3)).await; // less than the 10 s lease
    let retry = svc.oneshot(post()).await.unwrap();
    assert_eq!(retry.status(), StatusCode::OK);
    assert_eq!(calls.load(SeqCst), 2);
}
