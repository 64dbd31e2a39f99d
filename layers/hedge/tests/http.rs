//! The `http` module's promises: only requests safe to send twice are hedged (an idempotent
//! method, an `Idempotency-Key`, a `SafeToRetry` mark); a stamped `POST` is hedged with the same
//! key on every copy; a `409` in progress waits for the copy that holds the claim; a body over
//! the limit is sent once. Paused time; the copies that reached the service and their keys are
//! counted.

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;
use tower::{Layer, ServiceExt};
use tower_once_core::body::BufferedBody;
use tower_once_core::resend::SafeToRetry;
use tower_once_hedge::http::HttpHedgeLayer;

type Req = Request<BufferedBody<Full<Bytes>>>;

/// A server whose first copy of each request takes 5 s and whose others 20 ms; with
/// `claims`, it answers a copy of a key already running `409` in progress, as
/// `IdempotencyLayer` does.
#[derive(Clone, Default)]
struct Server {
    copies: Arc<AtomicU32>,
    keys: Arc<Mutex<Vec<Option<String>>>>,
    bodies: Arc<Mutex<Vec<Bytes>>>,
    claims: bool,
}

impl Server {
    fn service(
        &self,
    ) -> impl tower::Service<
        Req,
        Response = Response<String>,
        Error = std::io::Error,
        Future = impl Send,
    > + Clone
           + Send
           + 'static {
        let this = self.clone();
        tower::service_fn(move |req: Req| {
            let n = this.copies.fetch_add(1, SeqCst);
            let key = req
                .headers()
                .get("idempotency-key")
                .map(|v| v.to_str().unwrap().to_owned());
            this.keys.lock().unwrap().push(key);
            let bodies = this.bodies.clone();
            let claims = this.claims;
            async move {
                use http_body_util::BodyExt;
                let body = req.into_body().collect().await.unwrap().to_bytes();
                bodies.lock().unwrap().push(body);
                let (ms, status) = match (n, claims) {
                    (0, _) => (5_000, 201),
                    (_, true) => (20, 409),
                    (_, false) => (20, 201),
                };
                tokio::time::sleep(Duration::from_millis(ms)).await;
                let mut res = Response::new(format!("copy {n}"));
                *res.status_mut() = StatusCode::from_u16(status).unwrap();
                if status == 409 {
                    res.headers_mut()
                        .insert("retry-after", "1".parse().unwrap());
                }
                Ok(res)
            }
        })
    }
}

fn request(method: &str) -> Request<Full<Bytes>> {
    Request::builder()
        .method(method)
        .uri("http://a.example/charges")
        .body(Full::new(Bytes::from_static(b"{\"amount\":500}")))
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_post_without_a_key_is_never_hedged() {
    let server = Server::default();
    let svc = HttpHedgeLayer::new(Duration::from_millis(100)).layer(server.service());
    let res = svc.oneshot(request("POST")).await.unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    assert_eq!(server.copies.load(SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn safe_requests_are_hedged_with_their_body() {
    for method in ["GET", "PUT", "DELETE"] {
        let server = Server::default();
        let svc = HttpHedgeLayer::new(Duration::from_millis(100)).layer(server.service());
        let started = Instant::now();
        assert_eq!(svc.oneshot(request(method)).await.unwrap().body(), "copy 1");
        assert_eq!(started.elapsed(), Duration::from_millis(120), "{method}");
        let bodies = server.bodies.lock().unwrap().clone();
        assert_eq!(bodies.len(), 2);
        assert!(bodies.iter().all(|b| b == "{\"amount\":500}"));
    }
    let server = Server::default();
    let mut completion = request("POST");
    completion.extensions_mut().insert(SafeToRetry);
    let svc = HttpHedgeLayer::new(Duration::from_millis(100)).layer(server.service());
    svc.oneshot(completion).await.unwrap();
    assert_eq!(server.copies.load(SeqCst), 2);
    assert_eq!(*server.keys.lock().unwrap(), [None, None], "no key sent");
}

#[tokio::test(start_paused = true)]
async fn a_stamped_post_is_hedged_with_the_same_key_on_every_copy() {
    let server = Server::default();
    let svc = HttpHedgeLayer::new(Duration::from_millis(100))
        .stamp_idempotency_keys(true)
        .max_hedges(2)
        .layer(server.service());
    svc.oneshot(request("POST")).await.unwrap();
    let keys = server.keys.lock().unwrap().clone();
    assert_eq!(
        keys.len(),
        2,
        "the hedge answered before a second one was due"
    );
    assert!(keys[0].is_some());
    assert_eq!(keys[0], keys[1]);
}

#[tokio::test(start_paused = true)]
async fn a_copy_answered_in_progress_waits_for_the_one_holding_the_claim() {
    let server = Server {
        claims: true,
        ..Server::default()
    };
    let svc = HttpHedgeLayer::new(Duration::from_millis(100))
        .stamp_idempotency_keys(true)
        .layer(server.service());
    let res = svc.oneshot(request("POST")).await.unwrap();
    assert_eq!(res.status(), StatusCode::CREATED, "not the 409");
    assert_eq!(res.body(), "copy 0");
}

#[tokio::test(start_paused = true)]
async fn a_body_over_the_limit_is_sent_once() {
    let server = Server::default();
    let svc = HttpHedgeLayer::new(Duration::from_millis(100))
        .body_limit(4)
        .layer(server.service());
    svc.oneshot(request("PUT")).await.unwrap();
    assert_eq!(server.copies.load(SeqCst), 1);
    assert_eq!(
        server.bodies.lock().unwrap()[0],
        "{\"amount\":500}",
        "sent whole"
    );
}

/// A request body that yields its one chunk only after `after` (a slow upload).
struct SlowBody {
    sleep: std::pin::Pin<Box<tokio::time::Sleep>>,
    data: Option<Bytes>,
}

impl SlowBody {
    fn new(after: Duration) -> Self {
        Self {
            sleep: Box::pin(tokio::time::sleep(after)),
            data: Some(Bytes::from_static(b"{\"amount\":500}")),
        }
    }
}

impl http_body::Body for SlowBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, std::io::Error>>> {
        use std::future::Future;
        if self.data.is_none() {
            return std::task::Poll::Ready(None);
        }
        std::task::ready!(self.sleep.as_mut().poll(cx));
        std::task::Poll::Ready(self.data.take().map(|d| Ok(http_body::Frame::data(d))))
    }
}

/// "No answer after the delay: sends a hedge." A request whose body takes 300 ms to read
/// (a slow upload) to a server that answers every copy in 20 ms: the first copy answers 20 ms
/// after it is sent, well within the 100 ms delay, so no hedge is due. The delay must count
/// from the send of the first copy, not from the call: otherwise every slow upload is sent
/// twice at once, doubling the load for requests that were never slow to answer.
#[tokio::test(start_paused = true)]
async fn a_slow_request_body_does_not_make_a_fast_answer_hedged() {
    let copies = Arc::new(AtomicU32::new(0));
    let count = copies.clone();
    let server = tower::service_fn(move |req: Request<BufferedBody<SlowBody>>| {
        count.fetch_add(1, SeqCst);
        async move {
            use http_body_util::BodyExt;
            let _ = req.into_body().collect().await;
            tokio::time::sleep(Duration::from_millis(20)).await;
            Ok::<_, std::io::Error>(Response::new(String::new()))
        }
    });
    let svc = HttpHedgeLayer::new(Duration::from_millis(100)).layer(server);
    let req = Request::put("http://a.example/profile")
        .body(SlowBody::new(Duration::from_millis(300)))
        .unwrap();
    let started = Instant::now();
    svc.oneshot(req).await.unwrap();
    assert_eq!(started.elapsed(), Duration::from_millis(320));
    assert_eq!(
        copies.load(SeqCst),
        1,
        "a copy answering 20 ms after its send was hedged at once"
    );
}

type IdemReq = Request<tower_once_idempotency::RequestBody<BufferedBody<Full<Bytes>>>>;

/// A charge handler behind a real `IdempotencyLayer`: the first charge takes 500 ms, the
/// others 20 ms; every charge is counted.
fn charging_server(
    charges: Arc<AtomicU32>,
) -> impl tower::Service<
    Request<BufferedBody<Full<Bytes>>>,
    Response = Response<tower_once_idempotency::ResponseBody<Full<Bytes>>>,
    Error = std::convert::Infallible,
    Future = impl Send,
> + Clone
       + Send
       + 'static {
    let calls = Arc::new(AtomicU32::new(0));
    tower_once_idempotency::IdempotencyLayer::new().layer(tower::service_fn(move |req: IdemReq| {
        let n = calls.fetch_add(1, SeqCst);
        let charges = charges.clone();
        async move {
            use http_body_util::BodyExt;
            let _ = req.into_body().collect().await;
            tokio::time::sleep(Duration::from_millis(if n == 0 { 500 } else { 20 })).await;
            charges.fetch_add(1, SeqCst);
            let mut res = Response::new(Full::new(Bytes::from_static(b"charged")));
            *res.status_mut() = StatusCode::CREATED;
            Ok::<_, std::convert::Infallible>(res)
        }
    }))
}

/// Hedged POSTs against a real `IdempotencyLayer` charge once per operation: the stamped key
/// is on both copies, the hedge is told `409` in progress and the slow first copy's `201`
/// is the answer, though three hedges were sent.
#[tokio::test(start_paused = true)]
async fn hedged_posts_against_an_idempotency_server_charge_once_each() {
    let charges = Arc::new(AtomicU32::new(0));
    let server = charging_server(charges.clone());
    let svc = HttpHedgeLayer::new(Duration::from_millis(100))
        .stamp_idempotency_keys(true)
        .max_hedges(3)
        .no_budget()
        .layer(server);
    let res = svc.oneshot(request("POST")).await.unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    assert_eq!(charges.load(SeqCst), 1, "one operation, one charge");
}

/// A request whose `Idempotency-Key` the server finds invalid (empty) is hedged (it has a
/// key), but the idempotency server refuses every copy with `400`: no charge at all, and the
/// `400` is the answer.
#[tokio::test(start_paused = true)]
async fn a_post_with_an_invalid_key_is_refused_not_charged_twice() {
    let charges = Arc::new(AtomicU32::new(0));
    let server = charging_server(charges.clone());
    let svc = HttpHedgeLayer::new(Duration::from_millis(100))
        .no_budget()
        .layer(server);
    let mut req = request("POST");
    req.headers_mut()
        .insert("idempotency-key", http::HeaderValue::from_static(""));
    let res = svc.oneshot(req).await.unwrap();
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    assert_eq!(charges.load(SeqCst), 0);
}

/// "The latency observed runs from when the first copy is sent": with a percentile delay,
/// forty PUTs whose bodies take 100 ms to upload and whose answers take 20 ms (all within one
/// 5 s period) teach a delay of about 20 ms, not 120 ms; a later PUT whose first copy hangs
/// is hedged 20 ms after it was sent.
#[tokio::test(start_paused = true)]
async fn slow_uploads_do_not_inflate_the_percentile_delay() {
    let copies = Arc::new(AtomicU32::new(0));
    let slow_first = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (count, slow) = (copies.clone(), slow_first.clone());
    let server = tower::service_fn(move |req: Request<BufferedBody<SlowBody>>| {
        let n = count.fetch_add(1, SeqCst);
        let hang = slow.swap(false, SeqCst);
        async move {
            use http_body_util::BodyExt;
            let _ = req.into_body().collect().await;
            let ms = if hang { 5_000 } else { 20 };
            tokio::time::sleep(Duration::from_millis(ms)).await;
            Ok::<_, std::io::Error>(Response::new(format!("copy {n}")))
        }
    });
    let svc = HttpHedgeLayer::latency_percentile(0.9, 20, Duration::from_secs(5))
        .no_budget()
        .layer(server);
    let put = || {
        Request::put("http://a.example/profile")
            .body(SlowBody::new(Duration::from_millis(100)))
            .unwrap()
    };
    for _ in 0..40 {
        svc.clone().oneshot(put()).await.unwrap();
    }
    tokio::time::advance(Duration::from_secs(5)).await;
    assert_eq!(copies.load(SeqCst), 40);
    slow_first.store(true, SeqCst);
    let started = Instant::now();
    let res = svc.clone().oneshot(put()).await.unwrap();
    assert_eq!(copies.load(SeqCst), 42, "hedged once: {}", res.body());
    assert!(
        started.elapsed() < Duration::from_millis(100 + 60),
        "answered {:?} after the call (upload 100 ms, answers 20 ms)",
        started.elapsed()
    );
}

/// "A hedge only sends what is safe to send twice", whichever form of the layer: the generic
/// `HedgeLayer` on an `http::Request<Full<Bytes>>` (it is `Clone`, so it builds) in front of an
/// `IdempotencyLayer` whose keys are optional hedges a keyed `POST` (one charge: the key is on
/// both copies) and never an unkeyed one (one copy, one charge).
#[tokio::test(start_paused = true)]
async fn the_generic_layer_never_hedges_an_unkeyed_post() {
    type Plain = Request<tower_once_idempotency::RequestBody<Full<Bytes>>>;
    let charges = Arc::new(AtomicU32::new(0));
    let calls = Arc::new(AtomicU32::new(0));
    let (charged, called) = (charges.clone(), calls.clone());
    let server = tower_once_idempotency::IdempotencyLayer::new().layer(tower::service_fn(
        move |_: Plain| {
            let n = called.fetch_add(1, SeqCst);
            let charged = charged.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(if n == 0 { 500 } else { 20 })).await;
                charged.fetch_add(1, SeqCst);
                let mut res = Response::new(Full::new(Bytes::from_static(b"charged")));
                *res.status_mut() = StatusCode::CREATED;
                Ok::<_, std::convert::Infallible>(res)
            }
        },
    ));
    // The HTTP classifier, so that a copy told `409` in progress waits for the other.
    let hedged = tower_once_hedge::HedgeLayer::new(Duration::from_millis(100))
        .no_budget()
        .classify(tower_once_core::classify::HttpClassifier);

    let svc = hedged.clone().layer(server.clone());
    let res = svc.oneshot(request("POST")).await.unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    assert_eq!(calls.load(SeqCst), 1, "no copy of an unkeyed POST was sent");
    assert_eq!(charges.load(SeqCst), 1);

    calls.store(0, SeqCst); // its first copy is slow too: a hedge is sent, and told 409
    let svc = hedged.layer(server);
    let mut keyed = request("POST");
    keyed
        .headers_mut()
        .insert("idempotency-key", http::HeaderValue::from_static("k-1"));
    let res = svc.oneshot(keyed).await.unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    assert_eq!(charges.load(SeqCst), 2, "the keyed POST charged once");
}
