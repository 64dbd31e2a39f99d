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
