//! The HTTP client layers read a request's body so they can send it again, and that read is
//! inside the operation's deadline (crate docs of `tower_once::core::replay`): a request body
//! that stalls (an upload fed from a channel whose producer hangs) ends the operation at its
//! deadline in the retry layer, the fallback and the hedging layer alike. Paused time; the
//! calls each service received are counted.
#![cfg(all(feature = "retry", feature = "fallback", feature = "hedge"))]

use bytes::Bytes;
use futures_util::StreamExt;
use http::{Request, Response};
use http_body_util::{Full, StreamBody};
use std::convert::Infallible;
use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tower::{Layer, ServiceExt};
use tower_once::core::body::BufferedBody;
use tower_once::fallback::http::HttpFallbackLayer;
use tower_once::hedge::http::HttpHedgeLayer;
use tower_once::retry::RetryLayer;
use tower_once::timeout::{Deadline, TimeoutLayer};

type Frames = futures_util::stream::BoxStream<'static, Result<http_body::Frame<Bytes>, Infallible>>;
type Upload = StreamBody<Frames>;

/// A `PUT` whose body sends 4 bytes, then nothing more, for ever.
fn stalled_upload() -> Request<Upload> {
    let frames: Frames =
        futures_util::stream::iter([Ok(http_body::Frame::data(Bytes::from_static(b"part")))])
            .chain(futures_util::stream::pending())
            .boxed();
    Request::put("http://a.example/upload")
        .body(StreamBody::new(frames))
        .unwrap()
}

/// A service that answers at once, counting its calls.
fn counting(
    calls: &Arc<AtomicU32>,
) -> impl tower::Service<
    Request<BufferedBody<Upload>>,
    Response = Response<Full<Bytes>>,
    Error = std::io::Error,
    Future = impl std::future::Future<Output = Result<Response<Full<Bytes>>, std::io::Error>> + Send,
> + Clone
       + Send
       + 'static {
    let calls = calls.clone();
    tower::service_fn(move |_req: Request<BufferedBody<Upload>>| {
        calls.fetch_add(1, SeqCst);
        async { Ok::<_, std::io::Error>(Response::new(Full::new(Bytes::new()))) }
    })
}

#[tokio::test(start_paused = true)]
async fn the_retry_layer_cuts_a_stalled_upload_at_the_deadline() {
    let calls = Arc::new(AtomicU32::new(0));
    let svc = RetryLayer::new()
        .deadline(Duration::from_secs(1))
        .into_http()
        .layer(counting(&calls));
    let started = Instant::now();
    let err = svc.oneshot(stalled_upload()).await.unwrap_err();
    assert!(err.is_deadline(), "{err}");
    assert_eq!(started.elapsed(), Duration::from_secs(1));
    assert_eq!(calls.load(SeqCst), 0, "nothing was sent");
}

#[tokio::test(start_paused = true)]
async fn the_fallback_cuts_a_stalled_upload_at_the_deadline() {
    let (primary, secondary) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
    let svc = HttpFallbackLayer::new(counting(&secondary))
        .deadline(Duration::from_secs(1))
        .layer(counting(&primary));
    let started = Instant::now();
    let err = svc.oneshot(stalled_upload()).await.unwrap_err();
    assert!(err.is_deadline(), "{err}");
    assert_eq!(started.elapsed(), Duration::from_secs(1));
    assert_eq!((primary.load(SeqCst), secondary.load(SeqCst)), (0, 0));
}

/// The fallback without a deadline of its own cuts at the one the caller set.
#[tokio::test(start_paused = true)]
async fn the_fallback_cuts_a_stalled_upload_at_the_callers_deadline() {
    let (primary, secondary) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
    let svc = HttpFallbackLayer::new(counting(&secondary)).layer(counting(&primary));
    let mut req = stalled_upload();
    Deadline::after(Duration::from_secs(1)).attach(&mut req);
    let started = Instant::now();
    let err = svc.oneshot(req).await.unwrap_err();
    assert!(err.is_deadline(), "{err}");
    assert_eq!(started.elapsed(), Duration::from_secs(1));
}

/// The hedging layer enforces no deadline of its own: at the deadline the request carries, it
/// stops reading, sends the request down once, unhedged, and the timeout below ends it.
#[tokio::test(start_paused = true)]
async fn the_hedging_layer_cuts_a_stalled_upload_at_the_deadline() {
    let calls = Arc::new(AtomicU32::new(0));
    let svc = HttpHedgeLayer::new(Duration::from_millis(100))
        .layer(TimeoutLayer::new(Duration::from_secs(30)).layer(counting(&calls)));
    let mut req = stalled_upload();
    Deadline::after(Duration::from_secs(1)).attach(&mut req);
    let started = Instant::now();
    let out = tokio::time::timeout(Duration::from_secs(3600), svc.oneshot(req)).await;
    let err = out.expect("still pending an hour later").unwrap_err();
    assert!(err.is_elapsed(), "{err}");
    assert_eq!(started.elapsed(), Duration::from_secs(1));
    assert!(calls.load(SeqCst) <= 1, "never hedged");
}

type IoFrames =
    futures_util::stream::BoxStream<'static, Result<http_body::Frame<Bytes>, std::io::Error>>;
type IoUpload = StreamBody<IoFrames>;

/// A service of `IoUpload`s that answers at once, counting its calls.
fn counting_errors(
    calls: &Arc<AtomicU32>,
) -> impl tower::Service<
    Request<BufferedBody<IoUpload>>,
    Response = Response<Full<Bytes>>,
    Error = std::io::Error,
    Future = impl std::future::Future<Output = Result<Response<Full<Bytes>>, std::io::Error>> + Send,
> + Clone
       + Send
       + 'static {
    let calls = calls.clone();
    tower::service_fn(move |_req: Request<BufferedBody<IoUpload>>| {
        calls.fetch_add(1, SeqCst);
        async { Ok::<_, std::io::Error>(Response::new(Full::new(Bytes::new()))) }
    })
}

/// A keyed `POST` whose body arrives as `first` at once, then `last` exactly `at` later.
fn upload_ending_after(
    first: &'static [u8],
    last: Result<&'static [u8], ()>,
    at: Duration,
) -> Request<IoUpload> {
    let head = futures_util::stream::iter([Ok(http_body::Frame::data(Bytes::from_static(first)))]);
    let tail = futures_util::stream::once(async move {
        tokio::time::sleep(at).await;
        match last {
            Ok(bytes) => Ok(http_body::Frame::data(Bytes::from_static(bytes))),
            Err(()) => Err(std::io::Error::other("upload failed")),
        }
    });
    let frames: IoFrames = head.chain(tail).boxed();
    Request::post("http://a.example/charges")
        .header("idempotency-key", "k-upload")
        .body(StreamBody::new(frames))
        .unwrap()
}

/// Retry crate docs: "No attempt starts ... once it has passed". The body reaches the layer's
/// limit (16 bytes) exactly at the deadline (1 s): the reader gives the request back to send
/// once, and nothing may be sent then, whether the body ended, passed the limit or failed.
#[tokio::test(start_paused = true)]
async fn the_retry_layer_sends_nothing_when_the_body_ends_at_the_deadline() {
    let cases: [(&str, Result<&'static [u8], ()>); 3] = [
        ("ends within the limit", Ok(b"tail")),
        ("passes the limit", Ok(b"0123456789abcdef0123")),
        ("fails", Err(())),
    ];
    let mut sent = Vec::new();
    for (case, last) in cases {
        let calls = Arc::new(AtomicU32::new(0));
        let svc = RetryLayer::new()
            .deadline(Duration::from_secs(1))
            .into_http()
            .body_limit(16)
            .layer(counting_errors(&calls));
        let started = Instant::now();
        let out = svc
            .oneshot(upload_ending_after(b"part", last, Duration::from_secs(1)))
            .await;
        assert_eq!(started.elapsed(), Duration::from_secs(1), "{case}");
        sent.push((case, calls.load(SeqCst), out.is_err()));
    }
    assert_eq!(
        sent,
        [
            ("ends within the limit", 0, true),
            ("passes the limit", 0, true),
            ("fails", 0, true)
        ],
        "(case, requests sent at the deadline, ended with an error)"
    );
}

/// The same for the fallback (its deadline 1 s): a body that passes the limit or fails exactly
/// at the deadline reaches neither the primary nor the secondary.
#[tokio::test(start_paused = true)]
async fn the_fallback_sends_nothing_when_the_body_ends_at_the_deadline() {
    let cases: [(&str, Result<&'static [u8], ()>); 2] = [
        ("passes the limit", Ok(b"0123456789abcdef0123")),
        ("fails", Err(())),
    ];
    for (case, last) in cases {
        let (primary, secondary) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
        let svc = HttpFallbackLayer::new(counting_errors(&secondary))
            .deadline(Duration::from_secs(1))
            .body_limit(16)
            .layer(counting_errors(&primary));
        let started = Instant::now();
        let out = svc
            .oneshot(upload_ending_after(b"part", last, Duration::from_secs(1)))
            .await;
        assert_eq!(started.elapsed(), Duration::from_secs(1), "{case}");
        assert!(out.is_err_and(|e| e.is_deadline()), "{case}");
        assert_eq!(
            (primary.load(SeqCst), secondary.load(SeqCst)),
            (0, 0),
            "{case}"
        );
    }
}

/// A body that trickles one byte every 100 ms for 3 s (it never stalls for long, and stays
/// within the limit) is cut at the 1 s deadline, not when it ends: by the retry layer and the
/// fallback, nothing sent; by the hedging layer (a timeout below), at most one copy. Holds; the
/// other tests stall at once, this one checks that each chunk does not push the cutoff back.
#[tokio::test(start_paused = true)]
async fn a_trickling_upload_is_cut_at_the_deadline() {
    fn trickle() -> Request<Upload> {
        let frames: Frames = futures_util::stream::unfold(0u32, |n| async move {
            if n == 30 {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            Some((Ok(http_body::Frame::data(Bytes::from_static(b"x"))), n + 1))
        })
        .boxed();
        Request::put("http://a.example/upload")
            .body(StreamBody::new(frames))
            .unwrap()
    }
    let calls = Arc::new(AtomicU32::new(0));
    let retry = RetryLayer::new()
        .deadline(Duration::from_secs(1))
        .into_http()
        .layer(counting(&calls));
    let started = Instant::now();
    assert!(retry.oneshot(trickle()).await.unwrap_err().is_deadline());
    assert_eq!(started.elapsed(), Duration::from_secs(1));
    assert_eq!(calls.load(SeqCst), 0, "the retry layer sent nothing");

    let (primary, secondary) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
    let fallback = HttpFallbackLayer::new(counting(&secondary))
        .deadline(Duration::from_secs(1))
        .layer(counting(&primary));
    let started = Instant::now();
    assert!(fallback.oneshot(trickle()).await.unwrap_err().is_deadline());
    assert_eq!(started.elapsed(), Duration::from_secs(1));
    assert_eq!((primary.load(SeqCst), secondary.load(SeqCst)), (0, 0));

    let hedged = Arc::new(AtomicU32::new(0));
    let hedge = HttpHedgeLayer::new(Duration::from_millis(100))
        .layer(TimeoutLayer::new(Duration::from_secs(30)).layer(counting(&hedged)));
    let mut req = trickle();
    Deadline::after(Duration::from_secs(1)).attach(&mut req);
    let started = Instant::now();
    assert!(hedge.oneshot(req).await.is_err());
    assert_eq!(started.elapsed(), Duration::from_secs(1));
    assert!(hedged.load(SeqCst) <= 1, "never hedged");
}
