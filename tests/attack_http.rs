//! Attacks over real hyper/axum servers on loopback (guarantees 2, 6 and 8).

use axum::routing::post;
use axum::Router;
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tower_once::idempotency::IdempotencyLayer;

async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

/// Was a break found by the attack, now fixed. Over real hyper: a response over the store limit (an endless feed) to a client that
/// stays connected but stops reading. Once the socket buffers are full hyper stops polling the
/// body, so `ResponseBody::poll_frame` — the only place the streaming claim is renewed
/// (body.rs) — is not called; the lease lapses and a duplicate runs the handler a second time
/// while the first response is still open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_reader_of_a_streaming_response_keeps_its_claim() {
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = runs.clone();
    let app = Router::new()
        .route(
            "/feed",
            post(move || {
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

/// HOLDS: an HTTP/2 client cancels its request mid-handler (RST_STREAM): the handler finishes
/// on its own task, the retry is replayed, one run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_rst_stream_mid_handler_is_replayed() {
    let runs = Arc::new(AtomicUsize::new(0));
    let started = Arc::new(AtomicUsize::new(0));
    let (counter, entered) = (runs.clone(), started.clone());
    let app = Router::new()
        .route(
            "/charges",
            post(move || {
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

/// Sends a chunked (no Content-Length) upload of `len` bytes in 16 KiB chunks.
type Chunks = StreamBody<
    futures_util::stream::Iter<std::vec::IntoIter<Result<http_body::Frame<Bytes>, Infallible>>>,
>;

async fn chunked_upload(addr: SocketAddr, key: &str, len: usize) -> Result<StatusCode, String> {
    let client: Client<_, Chunks> = Client::builder(TokioExecutor::new()).build_http();
    let frames: Vec<_> = (0..len.div_ceil(16 * 1024))
        .map(|_| Ok(http_body::Frame::data(Bytes::from(vec![b'x'; 16 * 1024]))))
        .collect();
    let req = Request::post(format!("http://{addr}/upload"))
        .header("idempotency-key", key)
        .body(StreamBody::new(futures_util::stream::iter(frames)))
        .unwrap();
    match client.request(req).await {
        Ok(res) => {
            let status = res.status();
            let _ = res.into_body().collect().await;
            Ok(status)
        }
        Err(e) => Err(format!("{e:?}")),
    }
}

async fn upload_server(runs: Arc<AtomicUsize>) -> SocketAddr {
    let app = Router::new()
        .route(
            "/upload",
            post(move || {
                runs.fetch_add(1, SeqCst);
                async { StatusCode::CREATED }
            }),
        )
        .layer(IdempotencyLayer::new().body_limit(64 * 1024));
    serve(app).await
}

/// HOLDS: chunked uploads just over and 3x over the limit: the client reads the 413.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_uploads_over_the_limit_read_their_413() {
    let runs = Arc::new(AtomicUsize::new(0));
    let addr = upload_server(runs.clone()).await;
    for (n, len) in [80 * 1024, 192 * 1024, 900 * 1024].into_iter().enumerate() {
        let got = chunked_upload(addr, &format!("c{n}"), len).await;
        assert_eq!(got, Ok(StatusCode::PAYLOAD_TOO_LARGE), "{len} bytes");
    }
    assert_eq!(runs.load(SeqCst), 0);
}

/// Was broken: an upload that declares a body over the limit and then sends nothing got no
/// answer at all (the drain waited for bytes that never came). The drain is bounded in time
/// too: the client reads its 413 after about a second, and the connection is closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declared_upload_that_never_arrives_reads_its_413_and_the_connection_closes() {
    let runs = Arc::new(AtomicUsize::new(0));
    let app = Router::new()
        .route(
            "/upload",
            post({
                let runs = runs.clone();
                move || {
                    runs.fetch_add(1, SeqCst);
                    async { StatusCode::CREATED }
                }
            }),
        )
        .layer(IdempotencyLayer::new().body_limit(1024));
    let addr = serve(app).await;
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    conn.write_all(
        b"POST /upload HTTP/1.1\r\nhost: x\r\nidempotency-key: silent\r\ncontent-length: 5000\r\n\r\n",
    )
    .await
    .unwrap();
    // Everything the server sends until it closes; a bound far above the drain time, so
    // that a server that never answers fails the test instead of hanging it.
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(20), conn.read_to_end(&mut answer)).await;
    let answer = String::from_utf8_lossy(&answer).into_owned();
    assert!(
        read.is_ok(),
        "no answer and no close within 20 s: {answer:?}"
    );
    assert!(
        answer.starts_with("HTTP/1.1 413"),
        "the client reads its 413: {answer:?}"
    );
    assert!(
        answer.to_ascii_lowercase().contains("connection: close"),
        "{answer:?}"
    );
    assert_eq!(runs.load(SeqCst), 0);
}

/// Boundary (documented limit: the drain stops at max(4 x limit, 1 MiB)): a chunked upload of
/// 16 MiB with a 64 KiB limit. Records what the client sees; fails if it is not the 413.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "documented limit: past the drain bound the server closes, and hyper's client then fails its write without reading the 413"]
async fn a_chunked_upload_far_over_the_drain_bound() {
    let runs = Arc::new(AtomicUsize::new(0));
    let addr = upload_server(runs.clone()).await;
    let mut outcomes = Vec::new();
    for n in 0..5 {
        outcomes.push(chunked_upload(addr, &format!("f{n}"), 16 * 1024 * 1024).await);
    }
    assert_eq!(runs.load(SeqCst), 0);
    assert!(
        outcomes
            .iter()
            .all(|o| *o == Ok(StatusCode::PAYLOAD_TOO_LARGE)),
        "{outcomes:?}"
    );
}

/// Was broken: the task that finishes a handler whose client left was invisible to axum's
/// graceful shutdown: it waits for connections, there were none left, the process ended and
/// the handler was dropped half-way. Now the layer counts such tasks
/// (`IdempotencyLayer::detached`) and the shutdown waits for them after the server stopped.
#[test]
fn graceful_shutdown_waits_for_a_detached_handler() {
    assert_eq!(
        shutdown_during_handler(true),
        1,
        "the detached handler was dropped half-way by a graceful shutdown"
    );
}

/// HOLDS (control): the same shutdown while the client is still connected waits for the
/// handler, which finishes.
#[test]
fn graceful_shutdown_waits_for_an_attached_handler() {
    assert_eq!(shutdown_during_handler(false), 1);
}

fn shutdown_during_handler(client_leaves: bool) -> usize {
    let started = Arc::new(AtomicUsize::new(0));
    let finished = Arc::new(AtomicUsize::new(0));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (s, f) = (started.clone(), finished.clone());
    rt.block_on(async move {
        let layer = IdempotencyLayer::new();
        let detached = layer.detached();
        let app = Router::new()
            .route(
                "/charges",
                post(move || {
                    let (s, f) = (s.clone(), f.clone());
                    async move {
                        s.fetch_add(1, SeqCst);
                        tokio::time::sleep(Duration::from_millis(800)).await;
                        f.fetch_add(1, SeqCst); // the effect's second half
                        (StatusCode::CREATED, "charged")
                    }
                }),
            )
            .layer(layer);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = stopped.await;
                })
                .await
        });
        let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
        let req = Request::post(format!("http://{addr}/charges"))
            .header("idempotency-key", "deploy")
            .body(Full::new(Bytes::from_static(b"{}")))
            .unwrap();
        let request = tokio::spawn(client.request(req));
        for _ in 0..200 {
            if started.load(SeqCst) == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(started.load(SeqCst), 1);
        if client_leaves {
            request.abort(); // the client times out and leaves
            let _ = request.await;
            drop(client);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        let _ = stop.send(()); // a rolling deploy
        let _ = tokio::time::timeout(Duration::from_secs(5), server).await;
        // What a graceful shutdown does after the server stopped (see `Detached`).
        let _ = tokio::time::timeout(Duration::from_secs(5), detached.wait()).await;
    });
    drop(rt); // main returns
    finished.load(SeqCst)
}

/// A handler answering `len` bytes then trailers, announced in a `Trailer` header.
fn trailer_app(len: usize, limit: usize) -> Router {
    Router::new()
        .route(
            "/t",
            post(move || async move {
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

/// HOLDS: HTTP/1.1 trailers on a response over the store limit (streamed, not stored), and on
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

/// Was a break found by the attack, now fixed. An upload that declares `Content-Length` far over the limit with
/// `Expect: 100-continue` (curl does this for bodies over 1 MiB): the layer already knows it will
/// answer 413 (future/mod.rs `covered`: `declared > limit`), yet it polls the body to drain it,
/// which makes hyper send `100 Continue` — inviting the client to upload the 16 MiB it will
/// then cut off after the drain bound (a reset, see `a_chunked_upload_far_over_the_drain_bound`)
/// instead of answering 413 before the body is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expect_100_continue_over_the_limit_gets_413_without_an_upload() {
    let runs = Arc::new(AtomicUsize::new(0));
    let addr = upload_server(runs.clone()).await;
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    conn.write_all(
        b"POST /upload HTTP/1.1\r\nhost: x\r\nidempotency-key: e\r\nexpect: 100-continue\r\ncontent-length: 16777216\r\n\r\n",
    )
    .await
    .unwrap();
    let mut head = [0u8; 256];
    let n = tokio::time::timeout(Duration::from_secs(5), conn.read(&mut head))
        .await
        .expect("the server answers the Expect header")
        .unwrap();
    let line = String::from_utf8_lossy(&head[..n]);
    let line = line.lines().next().unwrap_or_default().to_owned();
    assert_eq!(runs.load(SeqCst), 0);
    assert_eq!(
        line, "HTTP/1.1 413 Payload Too Large",
        "the first answer to the upload"
    );
}
