//! The retry layer in the stacks deployments build (retry crate docs:
//! stacked `RetryLayer`s do not multiply, and the deadline bounds every layer below; crate docs:
//! one deadline for the whole operation, "whatever sits below"): an inner layer reached through an
//! `async` block or behind a `Buffer` defers to the outer one; a single-attempt request, a hanging
//! attempt with nothing below and an unkeyed `POST` still end at the deadline; `into_http()`
//! retries a `503` by default; absurd durations and `Retry-After` values never panic. Paused time;
//! every test counts the calls that reached the upstream.

mod support;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::get;
use tower::{Layer, Service, ServiceExt};
use tower_once_core::body::BufferedBody as ReplayBody;
use tower_once_retry::RetryLayer;
use tower_once_timeout::Deadline;

type HttpReq = Request<ReplayBody<Full<Bytes>>>;

/// An upstream that always answers `status`, counting calls.
fn always<B: Send + 'static>(
    status: u16,
    calls: Arc<AtomicUsize>,
) -> impl Service<Request<B>, Response = Response<Full<Bytes>>, Error = Infallible, Future = impl Send>
       + Clone
       + Send
       + 'static {
    tower::service_fn(move |_req: Request<B>| {
        calls.fetch_add(1, SeqCst);
        async move {
            let mut res = Response::new(Full::new(Bytes::new()));
            *res.status_mut() = StatusCode::from_u16(status).unwrap();
            Ok::<_, Infallible>(res)
        }
    })
}

#[tokio::test(start_paused = true)]
async fn into_http_retries_a_503_by_default() {
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = RetryLayer::new()
        .no_budget()
        .into_http()
        .layer(always(503, calls.clone()));
    let res = svc.oneshot(get()).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        calls.load(SeqCst),
        4,
        "a 503 was retried up to max_attempts"
    );
}

#[tokio::test(start_paused = true)]
async fn an_inner_retry_reached_through_an_async_block_defers_to_the_outer_one() {
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let failing = tower::service_fn(move |_req: u32| {
        counted.fetch_add(1, SeqCst);
        async { Err::<(), _>("reset") }
    });
    let inner = RetryLayer::new().no_budget().layer(failing);
    let deferred = tower::service_fn(move |req: u32| {
        let inner = inner.clone();
        async move { inner.oneshot(req).await }
    });
    let outer = RetryLayer::new().no_budget().layer(deferred);
    let err = outer.oneshot(7).await.unwrap_err();
    assert_eq!(err.attempts(), 4);
    assert_eq!(calls.load(SeqCst), 4, "4 attempts, not 4 x 4");
}

#[tokio::test(start_paused = true)]
async fn an_inner_http_retry_behind_a_buffer_defers_to_the_outer_one() {
    let calls = Arc::new(AtomicUsize::new(0));
    let inner = RetryLayer::new()
        .no_budget()
        .into_http()
        .layer(always(503, calls.clone()));
    let buffered = tower::buffer::Buffer::new(inner, 16);
    let outer = RetryLayer::new()
        .no_budget()
        .into_http()
        .layer(tower::service_fn(move |req: HttpReq| {
            let buffered = buffered.clone();
            async move { buffered.oneshot(req).await }
        }));
    let res = outer.oneshot(get()).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(calls.load(SeqCst), 4, "4 attempts, not 4 x 4");
}

#[tokio::test(start_paused = true)]
async fn a_single_attempt_request_still_carries_the_deadline() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let upstream = tower::service_fn(move |req: HttpReq| {
        log.lock()
            .unwrap()
            .push((Deadline::of(&req).is_some(), Deadline::current().is_some()));
        async { Ok::<_, Infallible>(Response::new(Full::new(Bytes::new()))) }
    });
    let svc = RetryLayer::new()
        .deadline(Duration::from_secs(5))
        .into_http()
        .layer(upstream);
    let post = Request::builder()
        .method(Method::POST)
        .uri("/charges")
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    svc.oneshot(post).await.unwrap();
    assert_eq!(*seen.lock().unwrap(), [(true, true)], "extension and scope");
}

#[tokio::test(start_paused = true)]
async fn the_deadline_ends_a_hanging_attempt_with_nothing_below() {
    let hanging = tower::service_fn(|_req: u32| std::future::pending::<Result<(), &str>>());
    let svc = RetryLayer::new()
        .deadline(Duration::from_secs(1))
        .layer(hanging);
    let started = tokio::time::Instant::now();
    let err = svc.oneshot(1).await.unwrap_err();
    assert!(err.is_deadline(), "{err}");
    assert!(err.get_inner().is_none());
    assert_eq!(
        started.elapsed(),
        Duration::from_secs(1),
        "paused clock: exactly the deadline"
    );
}

#[tokio::test(start_paused = true)]
async fn the_deadline_ends_a_hanging_unkeyed_post_too() {
    let hanging = tower::service_fn(|_req: HttpReq| {
        std::future::pending::<Result<Response<Full<Bytes>>, Infallible>>()
    });
    let svc = RetryLayer::new()
        .deadline(Duration::from_secs(2))
        .into_http()
        .layer(hanging);
    let post = Request::post("/x").body(Full::new(Bytes::new())).unwrap();
    let err = svc.oneshot(post).await.unwrap_err();
    assert!(err.is_deadline());
}

#[tokio::test(start_paused = true)]
async fn absurd_durations_and_retry_after_values_never_panic() {
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let upstream = tower::service_fn(move |_req: HttpReq| {
        let n = counted.fetch_add(1, SeqCst);
        async move {
            let mut res = Response::new(Full::new(Bytes::new()));
            if n == 0 {
                *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
                res.headers_mut()
                    .insert("retry-after", "99999999999999999999".parse().unwrap());
            }
            Ok::<_, Infallible>(res)
        }
    });
    let svc = RetryLayer::new()
        .deadline(Duration::MAX)
        .retry_after_cap(Duration::MAX)
        .into_http()
        .layer(upstream);
    let res = svc.oneshot(get()).await.unwrap();
    // Either waited (capped) and retried, or gave up at once: never a panic.
    assert!(res.status() == StatusCode::OK || res.status() == StatusCode::SERVICE_UNAVAILABLE);
}
