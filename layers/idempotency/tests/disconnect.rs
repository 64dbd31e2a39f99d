//! A client that goes away while its handler runs (idempotency crate docs "What happens to a
//! request": the handler runs to completion on a task of its own and its response is stored, so the
//! retry is replayed; `cancel_on_disconnect(true)` drops it and releases the key instead): a
//! response future dropped under `tower::timeout` or by its caller (paused time), an HTTP/2 stream
//! reset over real hyper, and a detached handler that panics. Every test counts handler runs.

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
use support::{post, send, serve, Handler};
use tower::{Layer, Service, ServiceExt};
use tower_once_idempotency::store::MemoryStore;
use tower_once_idempotency::{IdempotencyLayer, RequestBody};

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
    assert!(timed
        .oneshot(post("/events", Some("k"), "{}"))
        .await
        .is_err());
    tokio::time::sleep(Duration::from_secs(60)).await;
    let retry = svc.oneshot(post("/events", Some("k"), "{}")).await.unwrap();
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
    assert!(timed
        .oneshot(post("/events", Some("k"), "{}"))
        .await
        .is_err());
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(finished.load(SeqCst), 0, "the handler was dropped");
    let retry = svc.oneshot(post("/events", Some("k"), "{}")).await.unwrap();
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
    assert!(timed
        .oneshot(post("/events", Some("k"), "{}"))
        .await
        .is_err());
    tokio::time::sleep(Duration::from_secs(3)).await; // less than the 10 s lease
    let retry = svc.oneshot(post("/events", Some("k"), "{}")).await.unwrap();
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

#[tokio::test(start_paused = true)]
async fn client_gone_mid_run_still_finishes_the_handler_and_the_retry_is_replayed() {
    let handler = Handler::default();
    let mut svc = IdempotencyLayer::new().layer(handler.clone());
    let mut pending = Box::pin(svc.ready().await.unwrap().call(post(
        "/c?sleep_ms=5000",
        Some("k"),
        "x",
    )));
    assert!(futures_util::poll!(pending.as_mut()).is_pending());
    assert_eq!(handler.runs(), 1);
    assert_eq!(svc.store_ref().len(), 1, "claimed while running");
    drop(pending); // the client went away (timed out, disconnected)
    tokio::task::yield_now().await;
    assert_eq!(svc.store_ref().len(), 1, "the key is still held");

    let early = send(&svc, post("/c?sleep_ms=5000", Some("k"), "x")).await;
    assert_eq!(early.status, StatusCode::CONFLICT, "still running");

    tokio::time::sleep(Duration::from_secs(6)).await;
    let retry = send(&svc, post("/c?sleep_ms=5000", Some("k"), "x")).await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert!(retry.replayed());
    assert_eq!(handler.runs(), 1, "the effect happened once");
}

#[tokio::test(start_paused = true)]
async fn cancel_on_disconnect_drops_the_handler_and_releases_the_key() {
    let handler = Handler::default();
    let mut svc = IdempotencyLayer::new()
        .cancel_on_disconnect(true)
        .layer(handler.clone());
    let mut pending = Box::pin(svc.ready().await.unwrap().call(post(
        "/c?sleep_ms=60000",
        Some("k"),
        "x",
    )));
    assert!(futures_util::poll!(pending.as_mut()).is_pending());
    assert_eq!(handler.runs(), 1);
    drop(pending);
    tokio::task::yield_now().await;
    assert!(svc.store_ref().is_empty(), "dropping released the key");

    let retry = send(&svc, post("/c", Some("k"), "x")).await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert_eq!(handler.runs(), 2, "the client's retry ran");
}
