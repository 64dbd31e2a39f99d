//! A client that goes away while its handler runs (idempotency crate docs "What happens to a
//! request": the handler runs to completion on a task of its own and its response is stored, so the
//! retry is replayed; `cancel_on_disconnect(true)` drops it and releases the key instead): a
//! response future dropped under `tower::timeout`, an HTTP/2 stream reset over real hyper, and a
//! detached handler that panics. Every test counts handler runs.

mod support;

use axum::Router;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;
use support::serve;
use tower::{Layer, ServiceExt};
use tower_once_idempotency::store::MemoryStore;
use tower_once_idempotency::{IdempotencyLayer, RequestBody};

fn post() -> Request<Full<Bytes>> {
    Request::post("/events")
        .header("idempotency-key", "k")
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap()
}

/// The response future is dropped (client gone, or `tower::timeout` around the layer)
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

/// `cancel_on_disconnect(true)`: the response future dropped mid-handler drops the
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

/// A handler that panics on its detached task (the client left): the claim is released
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

/// An HTTP/2 client cancels its request mid-handler (RST_STREAM): the handler finishes
/// on its own task, the retry is replayed, one run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_rst_stream_mid_handler_is_replayed() {
    let runs = Arc::new(AtomicUsize::new(0));
    let started = Arc::new(AtomicUsize::new(0));
    let (counter, entered) = (runs.clone(), started.clone());
    let app = Router::new()
        .route(
            "/charges",
            axum::routing::post(move || {
                let (counter, entered) = (counter.clone(), entered.clone());
                async move {
                    entered.fetch_add(1, SeqCst);
                    tokio::time::sleep(Duration::from_millis(400)).await;
                    counter.fetch_add(1, SeqCst);
                    (StatusCode::CREATED, "charged")
                }
            }),
        )
        .layer(IdempotencyLayer::new());
    let addr = serve(app).await;
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http();
    let req = || {
        Request::post(format!("http://{addr}/charges"))
            .header("idempotency-key", "h2")
            .body(Full::new(Bytes::from_static(b"{}")))
            .unwrap()
    };
    let first = tokio::spawn(client.request(req()));
    for _ in 0..400 {
        if started.load(SeqCst) == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert_eq!(started.load(SeqCst), 1, "the first handler is running");
    first.abort(); // the h2 client resets the stream
    let _ = first.await;
    let mut answer = None;
    for _ in 0..300 {
        let res = client.request(req()).await.unwrap();
        assert_eq!(res.version(), http::Version::HTTP_2);
        if res.status() != StatusCode::CONFLICT {
            answer = Some(res);
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let answer = answer.expect("the abandoned handler finished");
    assert_eq!(answer.status(), StatusCode::CREATED);
    assert!(answer.headers().contains_key("idempotent-replayed"));
    assert_eq!((runs.load(SeqCst), started.load(SeqCst)), (1, 1));
}
