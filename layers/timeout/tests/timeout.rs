//! The timeout layers' semantics table (crate docs "Semantics": each call capped at `min(limit,
//! time left before the Deadline)`, no call once the deadline is spent, which bound fired; the HTTP
//! client and server forms), on tokio's paused clock.

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody};
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;
use tower::{Layer, Service, ServiceExt};
use tower_once_timeout::grpc;
use tower_once_timeout::http::{HttpTimeoutLayer, ServerTimeoutLayer};
use tower_once_timeout::{Deadline, TimeoutLayer};

/// Counts calls and drops of the futures it hands out; each call sleeps `delay`.
#[derive(Clone, Default)]
struct Slow {
    calls: Arc<AtomicUsize>,
    dropped: Arc<AtomicUsize>,
    seen_deadline: Arc<Mutex<Option<Deadline>>>,
}

struct DropFlag(Arc<AtomicUsize>);
impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.fetch_add(1, SeqCst);
    }
}

impl Slow {
    fn service(
        &self,
    ) -> impl Service<Duration, Response = &'static str, Error = &'static str> + Clone {
        let this = self.clone();
        tower::service_fn(move |delay: Duration| {
            this.calls.fetch_add(1, SeqCst);
            *this.seen_deadline.lock().unwrap() = Deadline::current();
            let flag = DropFlag(this.dropped.clone());
            async move {
                let _flag = flag;
                tokio::time::sleep(delay).await;
                if delay == Duration::from_millis(13) {
                    return Err("inner failure");
                }
                Ok("done")
            }
        })
    }
}

const SEC: Duration = Duration::from_secs(1);

#[tokio::test(start_paused = true)]
async fn a_fast_call_passes() {
    let slow = Slow::default();
    let svc = TimeoutLayer::new(SEC).layer(slow.service());
    let started = Instant::now();
    assert_eq!(
        svc.oneshot(Duration::from_millis(100)).await.unwrap(),
        "done"
    );
    assert_eq!(started.elapsed(), Duration::from_millis(100));
    assert_eq!(slow.calls.load(SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_slow_call_elapses_at_the_limit_and_is_dropped() {
    let slow = Slow::default();
    let svc = TimeoutLayer::new(SEC).layer(slow.service());
    let started = Instant::now();
    let err = svc.oneshot(Duration::from_secs(60)).await.unwrap_err();
    assert_eq!(started.elapsed(), SEC, "fired exactly at the limit");
    let elapsed = err.elapsed().copied().unwrap();
    assert_eq!(elapsed.limit(), SEC);
    assert!(!elapsed.is_deadline());
    assert_eq!(slow.dropped.load(SeqCst), 1, "the inner future was dropped");
}

#[tokio::test(start_paused = true)]
async fn a_shorter_deadline_wins_and_reaches_the_inner_call() {
    let slow = Slow::default();
    let mut svc = TimeoutLayer::new(SEC).layer(slow.service());
    let deadline = Deadline::after(Duration::from_millis(300));
    let started = Instant::now();
    svc.ready().await.unwrap();
    let err = deadline
        .scope(|| svc.call(Duration::from_secs(60)))
        .await
        .unwrap_err();
    assert_eq!(started.elapsed(), Duration::from_millis(300));
    assert!(err.elapsed().unwrap().is_deadline());
    assert_eq!(*slow.seen_deadline.lock().unwrap(), Some(deadline));

    // A longer deadline leaves the limit in charge, and the inner call sees the limit's bound.
    let deadline = Deadline::after(Duration::from_secs(30));
    svc.ready().await.unwrap();
    let now = Instant::now();
    let err = deadline
        .scope(|| svc.call(Duration::from_secs(60)))
        .await
        .unwrap_err();
    assert!(!err.elapsed().unwrap().is_deadline());
    assert_eq!(
        *slow.seen_deadline.lock().unwrap(),
        Some(Deadline::at(now + SEC))
    );
}

#[tokio::test(start_paused = true)]
async fn a_deadline_in_scope_while_polling_tightens_a_pending_call() {
    // The call is made with no deadline (the limit bounds it), then polled in the scope of an
    // earlier one: a later poll's tighter scope moves the timer again.
    let slow = Slow::default();
    let mut svc = TimeoutLayer::new(SEC).layer(slow.service());
    svc.ready().await.unwrap();
    let mut call = Box::pin(svc.call(Duration::from_secs(60)));
    let started = Instant::now();
    // Pending first with no scope: the limit's timer.
    assert!(futures_util::poll!(call.as_mut()).is_pending());
    let first = Deadline::after(Duration::from_millis(500));
    assert!(first
        .scope(|| futures_util::FutureExt::now_or_never(call.as_mut()))
        .is_none());
    let second = Deadline::after(Duration::from_millis(200));
    let err = second.in_scope(call).await.unwrap_err();
    assert_eq!(started.elapsed(), Duration::from_millis(200));
    let elapsed = err.elapsed().copied().unwrap();
    assert!(elapsed.is_deadline());
    assert_eq!(elapsed.limit(), Duration::from_millis(200));
    assert_eq!(slow.dropped.load(SeqCst), 1);

    // Tightened on its first poll (no timer yet), it fires at the scope's deadline too.
    svc.ready().await.unwrap();
    let started = Instant::now();
    let deadline = Deadline::after(Duration::from_millis(300));
    let err = deadline
        .in_scope(svc.call(Duration::from_secs(60)))
        .await
        .unwrap_err();
    assert_eq!(started.elapsed(), Duration::from_millis(300));
    assert!(err.elapsed().unwrap().is_deadline());
}

#[tokio::test(start_paused = true)]
async fn a_spent_deadline_never_calls_the_inner_service() {
    let slow = Slow::default();
    let mut svc = TimeoutLayer::new(SEC).layer(slow.service());
    let deadline = Deadline::after(Duration::from_millis(10));
    tokio::time::advance(Duration::from_millis(20)).await;
    svc.ready().await.unwrap();
    let err = deadline
        .scope(|| svc.call(Duration::ZERO))
        .await
        .unwrap_err();
    assert!(err.elapsed().unwrap().is_deadline());
    assert_eq!(slow.calls.load(SeqCst), 0);
}

#[tokio::test(start_paused = true)]
async fn a_result_ready_with_the_timer_wins() {
    let slow = Slow::default();
    let svc = TimeoutLayer::new(SEC).layer(slow.service());
    assert_eq!(svc.oneshot(SEC).await, Ok("done"), "inner is polled first");
}

#[tokio::test(start_paused = true)]
async fn inner_errors_keep_their_type() {
    let slow = Slow::default();
    let svc = TimeoutLayer::new(SEC).layer(slow.service());
    let err = svc.oneshot(Duration::from_millis(13)).await.unwrap_err();
    assert_eq!(err.get_inner(), Some(&"inner failure"));
    assert_eq!(err.into_inner(), Ok("inner failure"));
}

type Req = Request<Full<Bytes>>;

#[tokio::test(start_paused = true)]
async fn http_client_sets_the_extension_and_propagates_the_budget() {
    let seen = Arc::new(Mutex::new(None));
    let inner = {
        let seen = seen.clone();
        tower::service_fn(move |req: Req| {
            *seen.lock().unwrap() = Some((
                req.extensions().get::<Deadline>().copied(),
                req.headers().clone(),
            ));
            async { Ok::<_, Infallible>(Response::new(Full::<Bytes>::default())) }
        })
    };
    let svc = HttpTimeoutLayer::new(SEC)
        .propagate_grpc_timeout()
        .layer(inner.clone());
    let now = Instant::now();
    svc.oneshot(Request::new(Full::default())).await.unwrap();
    let (deadline, headers) = seen.lock().unwrap().take().unwrap();
    assert_eq!(deadline, Some(Deadline::at(now + SEC)));
    assert_eq!(headers["grpc-timeout"], "1000000u");

    // A shorter deadline carried by the request wins, and the header says what is left.
    let mut req = Request::new(Full::default());
    req.extensions_mut()
        .insert(Deadline::after(Duration::from_millis(250)));
    let svc = HttpTimeoutLayer::new(SEC)
        .propagate_header(http::HeaderName::from_static("x-timeout-ms"))
        .layer(inner);
    svc.oneshot(req).await.unwrap();
    let (deadline, headers) = seen.lock().unwrap().take().unwrap();
    assert_eq!(
        deadline,
        Some(Deadline::at(now + Duration::from_millis(250)))
    );
    assert_eq!(headers["x-timeout-ms"], "250");
}

#[tokio::test(start_paused = true)]
async fn http_client_spent_deadline_sends_nothing() {
    let calls = Arc::new(AtomicUsize::new(0));
    let inner = {
        let calls = calls.clone();
        tower::service_fn(move |_: Req| {
            calls.fetch_add(1, SeqCst);
            async { Ok::<_, Infallible>(Response::new(Full::<Bytes>::default())) }
        })
    };
    let mut req = Request::new(Full::default());
    req.extensions_mut().insert(Deadline::after(Duration::ZERO));
    let err = HttpTimeoutLayer::new(SEC)
        .layer(inner)
        .oneshot(req)
        .await
        .unwrap_err();
    assert!(err.is_elapsed());
    assert_eq!(calls.load(SeqCst), 0);
}

type Drip = StreamBody<
    futures_util::stream::BoxStream<'static, Result<http_body::Frame<Bytes>, Infallible>>,
>;

/// A server that answers its head at once, then drips one byte every 2 s, 10 times.
fn dripping() -> impl Service<Req, Response = Response<Drip>, Error = Infallible> + Clone {
    tower::service_fn(|_: Req| async {
        use futures_util::StreamExt;
        let drip = futures_util::stream::iter(0..10)
            .then(|_| async {
                tokio::time::sleep(Duration::from_secs(2)).await;
                Ok(http_body::Frame::data(Bytes::from_static(b".")))
            })
            .boxed();
        Ok(Response::new(StreamBody::new(drip)))
    })
}

#[tokio::test(start_paused = true)]
async fn a_dripping_body_is_cut_at_the_limit_when_covered() {
    let limit = Duration::from_secs(5);
    let started = Instant::now();
    let res = HttpTimeoutLayer::new(limit)
        .cover_body(true)
        .layer(dripping())
        .oneshot(Request::new(Full::default()))
        .await
        .unwrap();
    let mut body = Box::pin(res.into_body());
    let mut bytes = 0;
    let err = loop {
        match body.frame().await {
            Some(Ok(_)) => bytes += 1,
            Some(Err(e)) => break e,
            None => panic!("the drip outlasted the limit"),
        }
    };
    assert!(err.is_elapsed());
    assert_eq!(
        started.elapsed(),
        limit,
        "cut at the limit, counted from the call"
    );
    assert_eq!(bytes, 2, "the bytes at 2 s and 4 s arrived");

    // Uncovered (the default), the head was in time and the body may take as long as it takes.
    let res = HttpTimeoutLayer::new(limit)
        .layer(dripping())
        .oneshot(Request::new(Full::default()))
        .await
        .unwrap();
    assert_eq!(
        res.into_body().collect().await.unwrap().to_bytes().len(),
        10
    );
}

fn handler(
    delay: Duration,
    seen: Arc<Mutex<Option<Deadline>>>,
) -> impl Service<Req, Response = Response<Full<Bytes>>, Error = Infallible> + Clone {
    tower::service_fn(move |req: Req| {
        *seen.lock().unwrap() = req.extensions().get::<Deadline>().copied();
        async move {
            tokio::time::sleep(delay).await;
            Ok(Response::new(Full::new(Bytes::from_static(b"ok"))))
        }
    })
}

#[tokio::test(start_paused = true)]
async fn server_mode_answers_a_status_and_shows_the_handler_its_deadline() {
    let seen = Arc::new(Mutex::new(None));
    let started = Instant::now();
    let res = ServerTimeoutLayer::new(SEC)
        .layer(handler(Duration::from_secs(30), seen.clone()))
        .oneshot(Request::new(Full::default()))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(started.elapsed(), SEC);
    assert_eq!(*seen.lock().unwrap(), Some(Deadline::at(started + SEC)));

    let res = ServerTimeoutLayer::new(SEC)
        .status(StatusCode::GATEWAY_TIMEOUT)
        .layer(handler(Duration::from_secs(30), seen.clone()))
        .oneshot(Request::new(Full::default()))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::GATEWAY_TIMEOUT);

    let res = ServerTimeoutLayer::new(SEC)
        .layer(handler(Duration::from_millis(10), seen))
        .oneshot(Request::new(Full::default()))
        .await
        .unwrap();
    assert_eq!(
        res.status(),
        StatusCode::OK,
        "in time: the handler's answer"
    );
    assert_eq!(res.into_body().collect().await.unwrap().to_bytes(), "ok");
}

#[tokio::test(start_paused = true)]
async fn grpc_requests_get_deadline_exceeded_and_may_bring_their_own_timeout() {
    let seen = Arc::new(Mutex::new(None));
    let grpc_request = |timeout: Option<&'static str>| {
        let mut req = Request::post("/pkg.Svc/Call")
            .header("content-type", "application/grpc+proto")
            .body(Full::default())
            .unwrap();
        if let Some(t) = timeout {
            req.headers_mut()
                .insert("grpc-timeout", http::HeaderValue::from_static(t));
        }
        req
    };
    let layer = ServerTimeoutLayer::new(SEC).honor_grpc_timeout(true);

    let started = Instant::now();
    let res = layer
        .layer(handler(Duration::from_secs(30), seen.clone()))
        .oneshot(grpc_request(Some("200m")))
        .await
        .unwrap();
    assert_eq!(
        started.elapsed(),
        Duration::from_millis(200),
        "the client's grpc-timeout was shorter"
    );
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.headers()["grpc-status"], "4");

    let started = Instant::now();
    layer
        .layer(handler(Duration::from_secs(30), seen.clone()))
        .oneshot(grpc_request(Some("not-a-timeout")))
        .await
        .unwrap();
    assert_eq!(
        started.elapsed(),
        SEC,
        "a malformed grpc-timeout is ignored"
    );

    let started = Instant::now();
    ServerTimeoutLayer::new(SEC)
        .layer(handler(Duration::from_secs(30), seen))
        .oneshot(grpc_request(Some("200m")))
        .await
        .unwrap();
    assert_eq!(started.elapsed(), SEC, "not honoured unless enabled");
}

#[tokio::test(start_paused = true)]
async fn grpc_timeout_round_trips_between_client_and_server_layers() {
    // Client layer -> server layer directly: the server's handler sees the client's deadline.
    let seen = Arc::new(Mutex::new(None));
    let server = ServerTimeoutLayer::new(Duration::from_secs(60))
        .honor_grpc_timeout(true)
        .layer(handler(Duration::ZERO, seen.clone()));
    let through_the_wire = tower::service_fn(move |mut req: Req| {
        req.extensions_mut().clear(); // only headers cross the network
        server.clone().oneshot(req)
    });
    let started = Instant::now();
    HttpTimeoutLayer::new(Duration::from_millis(1500))
        .propagate_grpc_timeout()
        .layer(through_the_wire)
        .oneshot(Request::new(Full::default()))
        .await
        .unwrap();
    let deadline = seen.lock().unwrap().unwrap();
    assert_eq!(deadline.instant() - started, Duration::from_millis(1500));
    assert_eq!(grpc::decode(b"1500000u"), Some(Duration::from_millis(1500)));
}

/// An upstream that is busy (not ready) until `ready_at`, as one behind a concurrency or rate
/// limit is; each call counts, and so does the first poll of its future (the effect starts).
struct BusyUntil {
    ready_at: Instant,
    wait: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
    calls: Arc<AtomicUsize>,
    started: Arc<AtomicUsize>,
}

impl BusyUntil {
    fn new(ready_at: Instant) -> (Self, Arc<AtomicUsize>, Arc<AtomicUsize>) {
        let (calls, started) = (Arc::default(), Arc::default());
        let service = Self {
            ready_at,
            wait: None,
            calls: Arc::clone(&calls),
            started: Arc::clone(&started),
        };
        (service, calls, started)
    }
}

impl<R: Send + 'static> Service<R> for BusyUntil {
    type Response = &'static str;
    type Error = Infallible;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<&'static str, Infallible>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        let at = self.ready_at;
        let wait = self
            .wait
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(at)));
        std::task::ready!(std::future::Future::poll(wait.as_mut(), cx));
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: R) -> Self::Future {
        self.calls.fetch_add(1, SeqCst);
        let started = Arc::clone(&self.started);
        Box::pin(async move {
            started.fetch_add(1, SeqCst);
            Ok("charged")
        })
    }
}

/// A deadline in scope while the caller polls (`Deadline::in_scope`) reaches a `TimeoutLayer`
/// behind a `tower::buffer::Buffer`, up to a documented limit: the `Buffer`'s worker calls the
/// layer outside the caller's scope, so the inner service's `call` is made (a deadline carried on
/// the request prevents even that, see the next test); its future, which does the work, is never
/// polled once the caller's deadline has passed, and the caller gets the deadline's `Elapsed`,
/// never a late `Ok`.
#[tokio::test(start_paused = true)]
async fn behind_a_buffer_a_deadline_in_scope_that_passed_never_reaches_the_inner_service() {
    let started_at = Instant::now();
    let (busy, calls, started) = BusyUntil::new(started_at + Duration::from_millis(300));
    let buffered =
        tower::buffer::Buffer::new(TimeoutLayer::new(Duration::from_secs(10)).layer(busy), 8);
    let deadline = Deadline::after(Duration::from_millis(100));
    let result = deadline.in_scope(buffered.oneshot(7u32)).await;
    assert_eq!(
        started.load(SeqCst),
        0,
        "the upstream's call ran after the deadline: {result:?}"
    );
    assert!(
        calls.load(SeqCst) <= 1,
        "called at most once, by the worker"
    );
    let err = result.expect_err("the deadline passed before the upstream was ready");
    assert!(
        err.downcast_ref::<tower_once_timeout::TimeoutError<Infallible>>()
            .and_then(|e| e.elapsed())
            .is_some_and(|e| e.is_deadline()),
        "{err:?}"
    );
}

/// The same with a request that carries its deadline (`Deadline::attach` on an
/// `http::Request`): the layer behind the `Buffer` sees it spent and does not call the
/// upstream.
#[tokio::test(start_paused = true)]
async fn behind_a_buffer_a_carried_deadline_that_passed_never_reaches_the_inner_service() {
    let started_at = Instant::now();
    let (busy, calls, started) = BusyUntil::new(started_at + Duration::from_millis(300));
    let buffered =
        tower::buffer::Buffer::new(TimeoutLayer::new(Duration::from_secs(10)).layer(busy), 8);
    let mut req = Request::new(());
    Deadline::after(Duration::from_millis(100)).attach(&mut req);
    // A later deadline attached on the way does not loosen it.
    Deadline::after(Duration::from_secs(60)).attach(&mut req);
    let err = buffered.oneshot(req).await.expect_err("spent");
    assert!(
        err.downcast_ref::<tower_once_timeout::TimeoutError<Infallible>>()
            .and_then(|e| e.elapsed())
            .is_some_and(|e| e.is_deadline()),
        "{err:?}"
    );
    assert_eq!(started_at.elapsed(), Duration::from_millis(300));
    assert_eq!((calls.load(SeqCst), started.load(SeqCst)), (0, 0));
}
