//! Responses over the store limit (idempotency crate docs "What happens to a request": the first
//! caller gets it streamed in full; the key is kept, its lease renewed while it streams, and
//! becomes not replayable when it ends; duplicates get `409`): a body read, unread or dropped, a
//! reader stalled over real hyper, and trailers streamed or stored; over a plain tower service, the
//! first caller gets the whole response, a duplicate `409 not-replayable` once it ended, and a
//! response that fails mid-stream releases the key instead. Every test counts handler runs.

mod support;

use axum::Router;
use bytes::Bytes;
use futures_util::StreamExt;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;
use support::{post, send, serve, Handler, Req};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tower::{Layer, Service, ServiceExt};
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

/// A response over the store limit is kept claimed (renewed) while it streams, also to a client
/// that stops reading without leaving (hyper does not poll a body while the socket's send buffer is
/// full; HTTP/2 flow control likewise): the duplicate gets 409, never a second run. Was broken: the
/// renewal only happened inside `ResponseBody::poll_frame`, so an unpolled body let the lease lapse
/// while the first response was still being delivered.
#[tokio::test(start_paused = true)]
async fn an_unread_streaming_body_keeps_its_claim() {
    let runs = Arc::new(AtomicUsize::new(0));
    let svc = IdempotencyLayer::with_store(MemoryStore::new())
        .response_limit(16)
        .layer(sse(runs.clone()));
    let res = svc
        .clone()
        .oneshot(post("/events", Some("k"), "{}"))
        .await
        .unwrap();
    let mut body = res.into_body();
    let first = body.frame().await.unwrap().unwrap();
    assert_eq!(first.into_data().unwrap().len(), 64);
    // The client is slow: it does not read for 30 s (3 leases) but is still connected.
    tokio::time::sleep(Duration::from_secs(30)).await;
    let dup = svc
        .clone()
        .oneshot(post("/events", Some("k"), "{}"))
        .await
        .unwrap();
    assert_eq!(
        (runs.load(SeqCst), dup.status()),
        (1, StatusCode::CONFLICT),
        "the stream is still being delivered, yet the duplicate ran the handler"
    );
    drop(body);
}

/// The same stream, read by the client (idle between events): the renew timer
/// wakes the reader's task, the lease is renewed, the duplicate gets 409.
#[tokio::test(start_paused = true)]
async fn a_read_streaming_body_keeps_its_claim() {
    let runs = Arc::new(AtomicUsize::new(0));
    let svc = IdempotencyLayer::with_store(MemoryStore::new())
        .response_limit(16)
        .layer(sse(runs.clone()));
    let res = svc
        .clone()
        .oneshot(post("/events", Some("k"), "{}"))
        .await
        .unwrap();
    let mut body = res.into_body();
    let reader = tokio::spawn(async move { while let Some(Ok(_)) = body.frame().await {} });
    tokio::time::sleep(Duration::from_secs(30)).await;
    let dup = svc
        .clone()
        .oneshot(post("/events", Some("k"), "{}"))
        .await
        .unwrap();
    assert_eq!((runs.load(SeqCst), dup.status()), (1, StatusCode::CONFLICT));
    reader.abort();
}

/// The client stops reading by dropping the body mid-stream: not replayable, the
/// duplicate never runs the handler, even after the lease.
#[tokio::test(start_paused = true)]
async fn a_dropped_streaming_body_is_not_replayable() {
    let runs = Arc::new(AtomicUsize::new(0));
    let svc = IdempotencyLayer::with_store(MemoryStore::new())
        .response_limit(16)
        .layer(sse(runs.clone()));
    let res = svc
        .clone()
        .oneshot(post("/events", Some("k"), "{}"))
        .await
        .unwrap();
    let mut body = res.into_body();
    body.frame().await.unwrap().unwrap();
    drop(body);
    tokio::time::sleep(Duration::from_secs(30)).await;
    let dup = svc
        .clone()
        .oneshot(post("/events", Some("k"), "{}"))
        .await
        .unwrap();
    assert_eq!(runs.load(SeqCst), 1);
    assert!(dup.status().is_client_error(), "{}", dup.status());
}

/// Over real hyper: a response over the store limit (an endless feed) to a client that stays
/// connected but stops reading keeps its claim, though hyper stops polling the body once the socket
/// buffers are full: a duplicate gets 409 while the first response is still open. Was broken:
/// `ResponseBody::poll_frame`, the only place the streaming claim was renewed, was not called, so
/// the lease lapsed and the duplicate ran the handler a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_reader_of_a_streaming_response_keeps_its_claim() {
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = runs.clone();
    let app = Router::new()
        .route(
            "/feed",
            axum::routing::post(move || {
                counter.fetch_add(1, SeqCst);
                async {
                    let chunks = futures_util::stream::repeat_with(|| {
                        Ok::<_, Infallible>(Bytes::from(vec![b'x'; 64 * 1024]))
                    });
                    axum::body::Body::from_stream(chunks)
                }
            }),
        )
        .layer(
            IdempotencyLayer::new()
                .response_limit(1024)
                .lease(Duration::from_millis(500)),
        );
    let addr = serve(app).await;

    // A raw HTTP/1.1 client: sends the request, reads the start of the answer, then stalls
    // (still connected) for 3 s, six leases.
    let mut stalled = tokio::net::TcpStream::connect(addr).await.unwrap();
    stalled
        .write_all(
            b"POST /feed HTTP/1.1\r\nhost: x\r\nidempotency-key: feed\r\ncontent-length: 2\r\n\r\n{}",
        )
        .await
        .unwrap();
    let mut head = [0u8; 512];
    let n = stalled.read(&mut head).await.unwrap();
    assert!(
        head[..n].starts_with(b"HTTP/1.1 200"),
        "{:?}",
        String::from_utf8_lossy(&head[..n])
    );
    tokio::time::sleep(Duration::from_secs(3)).await;

    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let dup = client
        .request(
            Request::post(format!("http://{addr}/feed"))
                .header("idempotency-key", "feed")
                .body(Full::new(Bytes::from_static(b"{}")))
                .unwrap(),
        )
        .await
        .unwrap();
    let status = dup.status();
    drop(dup);
    drop(stalled);
    assert_eq!(
        (runs.load(SeqCst), status),
        (1, StatusCode::CONFLICT),
        "the first response is still open, yet the duplicate ran the handler"
    );
}

/// A handler answering `len` bytes then trailers, announced in a `Trailer` header.
fn trailer_app(len: usize, limit: usize) -> Router {
    Router::new()
        .route(
            "/t",
            axum::routing::post(move || async move {
                let mut trailers = http::HeaderMap::new();
                trailers.insert("x-checksum", http::HeaderValue::from_static("abc123"));
                let frames = vec![
                    Ok::<_, Infallible>(http_body::Frame::data(Bytes::from(vec![b'p'; len]))),
                    Ok(http_body::Frame::trailers(trailers)),
                ];
                http::Response::builder()
                    .status(StatusCode::CREATED)
                    .header("trailer", "x-checksum")
                    .body(axum::body::Body::new(StreamBody::new(
                        futures_util::stream::iter(frames),
                    )))
                    .unwrap()
            }),
        )
        .layer(IdempotencyLayer::new().response_limit(limit))
}

async fn trailer_of(addr: SocketAddr, key: &str) -> (StatusCode, usize, Option<String>) {
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let req = Request::post(format!("http://{addr}/t"))
        .header("idempotency-key", key)
        .header("te", "trailers")
        .body(Full::new(Bytes::from_static(b"x")))
        .unwrap();
    let res = client.request(req).await.unwrap();
    let status = res.status();
    let collected = res.into_body().collect().await.unwrap();
    let trailer = collected
        .trailers()
        .and_then(|t| t.get("x-checksum"))
        .map(|v| v.to_str().unwrap().to_owned());
    (status, collected.to_bytes().len(), trailer)
}

/// HTTP/1.1 trailers on a response over the store limit (streamed, not stored), and on
/// an empty-bodied stored response and its replay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http1_trailers_over_the_limit_and_with_an_empty_body() {
    let addr = serve(trailer_app(4096, 1024)).await;
    assert_eq!(
        trailer_of(addr, "big").await,
        (StatusCode::CREATED, 4096, Some("abc123".to_owned()))
    );
    let addr = serve(trailer_app(0, 1024)).await;
    let first = trailer_of(addr, "empty").await;
    let replay = trailer_of(addr, "empty").await;
    assert_eq!(first, (StatusCode::CREATED, 0, Some("abc123".to_owned())));
    assert_eq!(replay, first);
}

#[tokio::test(start_paused = true)]
async fn oversized_response_reaches_its_caller_and_is_never_rerun() {
    let handler = Handler::default();
    let svc = IdempotencyLayer::new()
        .response_limit(1000)
        .layer(handler.clone());
    let first = send(&svc, post("/c?big=5000", Some("k"), "x")).await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(
        first.body.len(),
        5000,
        "the first caller gets the whole response"
    );
    // The claim of a streamed response is finished by its own task once the body ended.
    tokio::task::yield_now().await;
    let dup = send(&svc, post("/c?big=5000", Some("k"), "x")).await;
    assert_eq!(dup.status, StatusCode::CONFLICT);
    assert_eq!(
        dup.problem_type(),
        "urn:tower-once:idempotency:not-replayable"
    );
    assert!(
        !dup.headers.contains_key("retry-after"),
        "retrying cannot help"
    );
    assert_eq!(handler.runs(), 1);
}

type FallibleFrames =
    futures_util::stream::Iter<std::vec::IntoIter<Result<http_body::Frame<Bytes>, &'static str>>>;

/// A handler whose response streams 4 KiB and then fails, or ends cleanly.
fn streaming_handler(
    runs: Arc<AtomicUsize>,
    fail: bool,
) -> impl Service<
    Req,
    Response = Response<StreamBody<FallibleFrames>>,
    Error = &'static str,
    Future = impl Future<Output = Result<Response<StreamBody<FallibleFrames>>, &'static str>> + Send,
> + Clone
       + Send
       + 'static {
    tower::service_fn(move |_req: Req| {
        runs.fetch_add(1, SeqCst);
        let mut frames: Vec<Result<http_body::Frame<Bytes>, &'static str>> = (0..4)
            .map(|_| Ok(http_body::Frame::data(Bytes::from(vec![b'x'; 1024]))))
            .collect();
        if fail {
            frames.push(Err("the response body failed"));
        }
        async move {
            Ok(Response::new(StreamBody::new(futures_util::stream::iter(
                frames,
            ))))
        }
    })
}

#[tokio::test(start_paused = true)]
async fn an_over_limit_response_that_fails_mid_stream_releases_the_key() {
    let runs = Arc::new(AtomicUsize::new(0));
    let mut svc = IdempotencyLayer::new()
        .response_limit(1024)
        .layer(streaming_handler(runs.clone(), true));
    let res = svc
        .ready()
        .await
        .unwrap()
        .call(post("/c", Some("k"), "x"))
        .await
        .unwrap();
    assert!(
        res.into_body().collect().await.is_err(),
        "the client saw the failure"
    );
    tokio::task::yield_now().await;
    assert!(
        svc.store_ref().is_empty(),
        "released, not kept as not-replayable"
    );
    let res = svc
        .ready()
        .await
        .unwrap()
        .call(post("/c", Some("k"), "x"))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK, "the retry ran");
    assert_eq!(runs.load(SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn an_over_limit_response_that_ends_cleanly_is_kept_not_replayable() {
    let runs = Arc::new(AtomicUsize::new(0));
    let mut svc = IdempotencyLayer::new()
        .response_limit(1024)
        .layer(streaming_handler(runs.clone(), false));
    let res = svc
        .ready()
        .await
        .unwrap()
        .call(post("/c", Some("k"), "x"))
        .await
        .unwrap();
    let body = res.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body.len(), 4 * 1024, "the first caller gets it all");
    tokio::task::yield_now().await;
    let res = svc
        .ready()
        .await
        .unwrap()
        .call(post("/c", Some("k"), "x"))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::CONFLICT);
    assert_eq!(runs.load(SeqCst), 1, "the handler never runs twice");
}
