//! Attacks on the RetryLayer's deadline and nesting guarantees (guarantee 9).

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tower::{Layer, Service, ServiceExt};
use tower_once_retry::RetryLayer;

/// A service that is never ready.
#[derive(Clone)]
struct NeverReady;

impl Service<u32> for NeverReady {
    type Response = u32;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = Result<u32, std::io::Error>> + Send>>;
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Pending
    }
    fn call(&mut self, req: u32) -> Self::Future {
        Box::pin(async move { Ok(req) })
    }
}

/// Was a break found by the attack, now fixed. "The deadline ends the operation whatever is below (incl. poll_ready hanging, Buffer
/// full)": only the readiness *between* attempts is cut (future.rs `Readying`). The first
/// readiness goes straight to the inner service (`Retry::poll_ready`, service.rs) and the
/// deadline is only fixed in `call`, so `oneshot` on a never-ready service never ends.
#[tokio::test(start_paused = true)]
async fn the_deadline_covers_the_first_poll_ready() {
    let svc = RetryLayer::new()
        .deadline(Duration::from_secs(1))
        .layer(NeverReady);
    let out = tokio::time::timeout(Duration::from_secs(3600), svc.oneshot(1)).await;
    assert!(
        out.is_ok(),
        "a 1 s deadline, and the operation was still pending after an hour"
    );
}

/// HOLDS (coverage): a `tower::buffer::Buffer` (bound 1) whose worker waits on an upstream that
/// is never ready: both operations end at their deadline (the Buffer's readiness does not hang
/// here; the hang needs a service that is itself never ready, see the test above).
#[tokio::test(start_paused = true)]
async fn the_deadline_does_not_cover_a_full_buffer() {
    let buffer = tower::buffer::Buffer::new(NeverReady, 1);
    let svc = RetryLayer::new()
        .deadline(Duration::from_secs(1))
        .layer(buffer);
    // The first operation takes the only slot and is cut at its deadline (this part holds)...
    let first = tokio::spawn(svc.clone().oneshot(1));
    tokio::task::yield_now().await;
    // ...the second cannot even start.
    let second = tokio::time::timeout(Duration::from_secs(3600), svc.oneshot(2)).await;
    let first = first.await.unwrap();
    eprintln!(
        "first: {:?}; second: {:?}",
        first.as_ref().map_err(|e| e.to_string()),
        second
            .as_ref()
            .map(|r| r.as_ref().map_err(|e| e.to_string()))
    );
    assert!(first.is_err());
    assert!(
        matches!(&second, Ok(Err(e)) if e.is_deadline()),
        "a 1 s deadline, and the operation behind a full Buffer was pending after an hour"
    );
}

fn failing(
    calls: Arc<AtomicUsize>,
) -> impl Service<u32, Response = (), Error = std::io::Error, Future = impl Send> + Clone + Send + 'static
{
    tower::service_fn(move |_req: u32| {
        calls.fetch_add(1, SeqCst);
        async { Err::<(), _>(std::io::Error::other("reset")) }
    })
}

/// A documented limit (ignored below): a nested retry of a request type that carries nothing
/// (`u32`), reached through `tokio::spawn` (a service that hands the call to a task, whose
/// future the outer attempt does not poll), sees neither the scope nor a mark: 4 x 4 calls.
/// `http::Request`, `tonic::Request`, `Job` and `OutboxMessage` carry the mark (see below).
#[tokio::test(start_paused = true)]
#[ignore = "documented limit (retry crate docs, 'What crosses a Buffer or a spawned task'): a request type that carries nothing, on another task"]
async fn generic_nested_retry_through_a_spawn_multiplies() {
    let calls = Arc::new(AtomicUsize::new(0));
    let inner = RetryLayer::new().no_budget().layer(failing(calls.clone()));
    let spawning = tower::service_fn(move |req: u32| {
        let inner = inner.clone();
        async move { tokio::spawn(inner.oneshot(req)).await.unwrap() }
    });
    let outer = RetryLayer::new().no_budget().layer(spawning);
    let _ = outer.oneshot(7).await;
    assert_eq!(calls.load(SeqCst), 4, "4 attempts, not 4 x 4");
}

type HttpReq = tower_once_retry::http::ReplayBody<Full<Bytes>>;

/// HOLDS: the HTTP form through `tokio::spawn` (the extension crosses).
#[tokio::test(start_paused = true)]
async fn http_nested_retry_through_a_spawn_defers() {
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let upstream = tower::service_fn(
        move |_req: Request<tower_once_retry::http::ReplayBody<HttpReq>>| {
            counted.fetch_add(1, SeqCst);
            async {
                let mut res = Response::new(Full::new(Bytes::new()));
                *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
                Ok::<_, Infallible>(res)
            }
        },
    );
    let inner = RetryLayer::new().no_budget().into_http().layer(upstream);
    let spawning = tower::service_fn(
        move |req: Request<tower_once_retry::http::ReplayBody<Full<Bytes>>>| {
            let inner = inner.clone();
            async move { tokio::spawn(inner.oneshot(req)).await.unwrap() }
        },
    );
    let outer = RetryLayer::new().no_budget().into_http().layer(spawning);
    let res = outer
        .oneshot(Request::get("/x").body(Full::new(Bytes::new())).unwrap())
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(calls.load(SeqCst), 4);
}

/// Was a break found by the attack (it panicked), now fixed. "Duration::MAX never panics" was fixed for `RetryLayer::deadline` and
/// `Deadline::after`, but the `TimeoutLayer` that sits below it computes `now + limit`
/// unchecked (tower-once-timeout timeout.rs `Budget::new`): `TimeoutLayer::new(Duration::MAX)`
/// ("no per-attempt limit, only the operation's deadline") panics on the first call.
#[tokio::test(start_paused = true)]
async fn timeout_layer_with_duration_max_does_not_panic_under_a_retry() {
    let ok = tower::service_fn(|req: u32| async move { Ok::<_, &str>(req) });
    let svc = RetryLayer::new()
        .deadline(Duration::from_secs(5))
        .layer(tower_once_timeout::TimeoutLayer::new(Duration::MAX).layer(ok));
    let out = tokio::spawn(svc.oneshot(3)).await;
    assert!(out.is_ok(), "the call panicked: {:?}", out.err());
}

/// Was broken: a nested RetryLayer with its own, shorter deadline (a per-dependency budget of
/// 1 s) became a bare pass-through and its deadline was dropped, so a hanging call through it
/// lasted the outer deadline (30 s). Now each call through it is cut at its own 1 s; the outer
/// layer retries that (a deadline cut is retryable), up to its attempts. Paused clock.
#[tokio::test(start_paused = true)]
async fn a_nested_layers_own_shorter_deadline_bounds_each_call_through_it() {
    let hanging =
        tower::service_fn(|_req: u32| std::future::pending::<Result<u32, std::io::Error>>());
    let inner = RetryLayer::new()
        .deadline(Duration::from_secs(1))
        .layer(hanging);
    let outer = RetryLayer::new()
        .deadline(Duration::from_secs(30))
        .no_budget()
        .layer(inner);
    let started = tokio::time::Instant::now();
    let err = outer.oneshot(1).await.unwrap_err();
    assert_eq!(err.attempts(), 4, "{err}");
    assert!(
        err.get_inner().is_some_and(|inner| inner.is_deadline()),
        "the last call was cut by the inner deadline: {err}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "bounded by 4 x 1 s plus waits, not the outer 30 s: {:?}",
        started.elapsed()
    );
}

/// Was a break found by the attack, now fixed. The HTTP form fixes the operation's deadline in `call`, then buffers the request body
/// (`HttpState::Buffering`, http.rs) with no cutoff: a request body that stalls (an upload fed
/// from a channel whose producer hangs) keeps the operation pending past its deadline, for ever.
#[tokio::test(start_paused = true)]
async fn a_stalled_request_body_is_inside_the_deadline() {
    type Frames =
        futures_util::stream::BoxStream<'static, Result<http_body::Frame<Bytes>, Infallible>>;
    let ok = tower::service_fn(
        |_req: Request<tower_once_retry::http::ReplayBody<http_body_util::StreamBody<Frames>>>| async {
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
        },
    );
    let svc = RetryLayer::new()
        .deadline(Duration::from_secs(1))
        .into_http()
        .layer(ok);
    use futures_util::StreamExt;
    let frames: Frames =
        futures_util::stream::iter([Ok(http_body::Frame::data(Bytes::from_static(b"part")))])
            .chain(futures_util::stream::pending())
            .boxed();
    let req = Request::put("/upload")
        .body(http_body_util::StreamBody::new(frames))
        .unwrap();
    let out = tokio::time::timeout(Duration::from_secs(3600), svc.oneshot(req)).await;
    assert!(
        out.is_ok(),
        "a 1 s deadline, and the request was still pending after an hour"
    );
}
