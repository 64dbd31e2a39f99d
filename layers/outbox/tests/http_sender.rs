//! The `http` module's semantics table (feature `http`): `HttpSender` over a real client to a
//! loopback axum provider, relaying a real outbox on the machine's PostgreSQL
//! (`DATABASE_URL`, default `postgres://postgres@127.0.0.1:5432/test`, a schema of its own per
//! test). With the relay's default classifier, a `503` never counts as sent, a `400` parks,
//! `Retry-After` sets the next attempt, every attempt carries the dedupe key as
//! `Idempotency-Key`, a topic without a route is not sent, and a success whose body never ends
//! is still a success.

mod support;

use axum::body::Bytes;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use http::header::{HeaderValue, CONTENT_TYPE};
use http_body_util::Full;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::{quick, Database, Schema};
use tower::{ServiceBuilder, ServiceExt};
use tower_once_outbox::classify::{Action, Classify, HttpClassifier};
use tower_once_outbox::http::{HttpSender, Route};
use tower_once_outbox::{Outbox, OutboxMessage, OutboxRelay, PassReport, RelayConfig};
use tower_once_retry::backoff::{Backoff, Jitter};
use tower_once_retry::RetryLayer;
use tower_once_timeout::http::HttpTimeoutLayer;

/// One request as the provider saw it.
#[derive(Debug, Clone)]
struct Seen {
    method: Method,
    path: String,
    key: Option<String>,
    content_type: Option<String>,
    body: Bytes,
}

/// An answer the provider gives: status, headers, body.
type Answer = (StatusCode, Vec<(&'static str, &'static str)>, &'static str);

/// A loopback HTTP provider that answers from a script (then `201`) and notes every request.
struct Provider {
    url: String,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Provider {
    async fn start(script: Vec<Answer>) -> Self {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let script = Arc::new(Mutex::new(VecDeque::from(script)));
        let (noted, answers) = (Arc::clone(&seen), script);
        let app = axum::Router::new().fallback(
            move |method: Method, uri: Uri, headers: HeaderMap, body: Bytes| {
                let header = |name| {
                    headers
                        .get(name)
                        .and_then(|v: &HeaderValue| v.to_str().ok())
                        .map(str::to_owned)
                };
                noted.lock().unwrap().push(Seen {
                    method,
                    path: uri.path().to_owned(),
                    key: header("idempotency-key"),
                    content_type: header("content-type"),
                    body,
                });
                let (status, headers, body) = answers.lock().unwrap().pop_front().unwrap_or((
                    StatusCode::CREATED,
                    vec![],
                    r#"{"id":"msg_1"}"#,
                ));
                async move {
                    let mut response = axum::response::Response::new(axum::body::Body::from(body));
                    *response.status_mut() = status;
                    for (name, value) in headers {
                        response
                            .headers_mut()
                            .insert(name, HeaderValue::from_static(value));
                    }
                    response
                }
            },
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self { url, seen }
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    fn route(&self) -> Route {
        Route::post(format!("{}/v1/send", self.url).parse().unwrap())
            .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
    }
}

fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

/// The row's `(attempts, sent, parked, last_error)`.
async fn row(db: &Schema, key: &str) -> (i32, bool, bool, Option<String>) {
    sqlx::query_as(
        "SELECT attempts, sent_at IS NOT NULL, parked_at IS NOT NULL, last_error \
         FROM outbox WHERE dedupe_key = $1",
    )
    .bind(key)
    .fetch_one(&db.pool)
    .await
    .unwrap()
}

/// Passes until one claims a row (a failed row is due again after `quick()`'s 1 ms backoff).
async fn pass_claiming<S, C>(relay: &OutboxRelay<S, C>) -> PassReport
where
    S: tower::Service<tower_once_outbox::OutboxMessage> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
    S::Error: std::fmt::Display + Send + 'static,
    C: Classify<S::Response, S::Error> + Send + Sync + 'static,
{
    for _ in 0..200 {
        let report = relay.pass().await.unwrap();
        if report.claimed > 0 {
            return report;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("no row became due again");
}

async fn enqueue(db: &Schema, outbox: &Outbox, topic: &str, key: &str, payload: &str) {
    let mut tx = db.pool.begin().await.unwrap();
    outbox.enqueue(&mut tx, topic, key, payload).await.unwrap();
    tx.commit().await.unwrap();
}

#[tokio::test]
async fn a_503_then_a_201_is_one_delivery_recorded_as_sent_after_the_second_attempt() {
    let db = Schema::new().await;
    let outbox = db.outbox().await;
    let provider = Provider::start(vec![(StatusCode::SERVICE_UNAVAILABLE, vec![], "busy")]).await;
    let payload = r#"{"to":"a@example.com"}"#;
    enqueue(&db, &outbox, "email", "order-1:mail", payload).await;
    let sender = HttpSender::new(client()).route("email", provider.route());
    // The relay's default classifier: nothing to remember.
    let relay = OutboxRelay::new(outbox, quick(), sender).unwrap();

    let first = relay.pass().await.unwrap();
    assert_eq!((first.claimed, first.sent, first.failed), (1, 0, 1));
    let (attempts, sent, parked, error) = row(&db, "order-1:mail").await;
    assert_eq!(
        (attempts, sent, parked),
        (1, false, false),
        "a 503 is not sent"
    );
    let error = error.unwrap();
    assert!(error.contains("503 Service Unavailable: busy"), "{error}");

    let second = pass_claiming(&relay).await;
    assert_eq!((second.sent, second.failed), (1, 0));
    let (attempts, sent, parked, _) = row(&db, "order-1:mail").await;
    assert_eq!((attempts, sent, parked), (1, true, false));
    assert_eq!(
        relay.pass().await.unwrap().claimed,
        0,
        "sent once, for good"
    );

    let seen = provider.seen();
    assert_eq!(seen.len(), 2, "two deliveries to the provider: {seen:?}");
    for request in &seen {
        assert_eq!(
            request.key.as_deref(),
            Some("order-1:mail"),
            "every attempt"
        );
        assert_eq!(request.method, Method::POST);
        assert_eq!(request.path, "/v1/send");
        assert_eq!(request.content_type.as_deref(), Some("application/json"));
        assert_eq!(request.body, payload.as_bytes());
    }
}

#[tokio::test]
async fn a_400_parks_the_row_with_the_providers_words() {
    let db = Schema::new().await;
    let outbox = db.outbox().await;
    let refusal = (
        StatusCode::BAD_REQUEST,
        vec![],
        r#"{"error":"invalid address"}"#,
    );
    let provider = Provider::start(vec![refusal]).await;
    enqueue(&db, &outbox, "email", "order-2:mail", "{}").await;
    let sender = HttpSender::new(client()).route("email", provider.route());
    let relay = OutboxRelay::new(outbox.clone(), quick(), sender).unwrap();

    let report = relay.pass().await.unwrap();
    assert_eq!((report.sent, report.failed, report.parked), (0, 0, 1));
    let parked = outbox.parked(10).await.unwrap();
    assert_eq!(parked.len(), 1);
    let error = parked[0].last_error.clone().unwrap();
    assert!(error.contains("400 Bad Request"), "{error}");
    assert!(error.contains("invalid address"), "{error}");
    assert_eq!(
        relay.pass().await.unwrap().claimed,
        0,
        "parked: not tried again"
    );
    assert_eq!(provider.seen().len(), 1);
}

#[tokio::test]
async fn retry_after_sets_the_next_attempt() {
    let db = Schema::new().await;
    let outbox = db.outbox().await;
    let slow_down = (
        StatusCode::TOO_MANY_REQUESTS,
        vec![("retry-after", "120")],
        "",
    );
    let provider = Provider::start(vec![slow_down]).await;
    enqueue(&db, &outbox, "email", "order-3:mail", "{}").await;
    let sender = HttpSender::new(client()).route("email", provider.route());
    let relay = OutboxRelay::new(outbox, quick(), sender).unwrap();

    let report = relay.pass().await.unwrap();
    assert_eq!((report.sent, report.failed), (0, 1));
    // The backoff alone (quick(): 1 ms) would make it due at once.
    let held_back: bool = sqlx::query_scalar(
        "SELECT next_attempt_at > now() + interval '100 seconds' FROM outbox \
         WHERE dedupe_key = 'order-3:mail'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(held_back, "the provider's Retry-After: 120 is the wait");
    assert_eq!(relay.pass().await.unwrap().claimed, 0);
    assert_eq!(provider.seen().len(), 1);
    let (_, sent, _, error) = row(&db, "order-3:mail").await;
    assert!(!sent);
    assert!(error.unwrap().contains("retry after 120s"));
}

#[tokio::test]
async fn a_topic_without_a_route_is_not_sent_and_parks_after_max_attempts() {
    let db = Schema::new().await;
    let outbox = db.outbox().await;
    let provider = Provider::start(vec![]).await;
    enqueue(&db, &outbox, "sms", "order-4:sms", "{}").await;
    let sender = HttpSender::new(client()).route("email", provider.route());
    let relay = OutboxRelay::new(outbox.clone(), quick().max_attempts(2), sender).unwrap();

    let first = relay.pass().await.unwrap();
    assert_eq!((first.sent, first.failed, first.parked), (0, 1, 0));
    let (attempts, sent, parked, error) = row(&db, "order-4:sms").await;
    assert_eq!((attempts, sent, parked), (1, false, false));
    assert_eq!(
        error.as_deref(),
        Some(r#"no HTTP route for outbox topic "sms""#)
    );

    let second = pass_claiming(&relay).await;
    assert_eq!((second.sent, second.parked), (0, 1));
    let (_, sent, parked, _) = row(&db, "order-4:sms").await;
    assert_eq!((sent, parked), (false, true));
    assert!(provider.seen().is_empty(), "no request was made");
    assert_eq!(outbox.stats().await.unwrap().sent, 0);
}

#[tokio::test]
async fn retry_and_timeout_layers_below_the_sender_stay_inside_one_send() {
    let db = Schema::new().await;
    let outbox = db.outbox().await;
    let busy = || (StatusCode::SERVICE_UNAVAILABLE, vec![], "");
    let provider = Provider::start(vec![busy(), busy()]).await;
    enqueue(&db, &outbox, "email", "order-5:mail", "{}").await;
    let client = ServiceBuilder::new()
        .layer(RetryLayer::new().backoff(quick_backoff()).into_http())
        .layer(HttpTimeoutLayer::new(Duration::from_secs(5)))
        .service(Client::builder(TokioExecutor::new()).build_http());
    let sender = HttpSender::new(client).route("email", provider.route());
    let relay = OutboxRelay::new(outbox, quick(), sender).unwrap();

    let report = relay.pass().await.unwrap();
    assert_eq!((report.sent, report.failed), (1, 0));
    let (attempts, sent, _, _) = row(&db, "order-5:mail").await;
    assert_eq!(
        (attempts, sent),
        (0, true),
        "the retries were the layer's, in one send"
    );
    let keys: Vec<_> = provider.seen().into_iter().map(|s| s.key).collect();
    assert_eq!(
        keys,
        vec![Some("order-5:mail".to_owned()); 3],
        "a keyed POST is retried with its key"
    );
}

#[tokio::test]
async fn the_senders_own_classifier_decides() {
    let db = Schema::new().await;
    let outbox = db.outbox().await;
    // An idempotency server's 409 without Retry-After: another relay is sending this key now.
    let provider = Provider::start(vec![(StatusCode::CONFLICT, vec![], "")]).await;
    enqueue(&db, &outbox, "email", "order-6:mail", "{}").await;
    let sender = HttpSender::new(client())
        .route("email", provider.route())
        .classify(ConflictIsTransient);
    let relay =
        OutboxRelay::new(outbox, RelayConfig::new().backoff(quick_backoff()), sender).unwrap();

    let first = relay.pass().await.unwrap();
    assert_eq!((first.failed, first.parked), (1, 0), "retried, not parked");
    assert_eq!(pass_claiming(&relay).await.sent, 1);
    assert_eq!(provider.seen().len(), 2);
}

/// HTTP's usual classes, except that a `409` is worth another attempt.
#[derive(Clone, Copy)]
struct ConflictIsTransient;

impl<B, E> Classify<http::Response<B>, E> for ConflictIsTransient {
    fn classify(&self, outcome: &Result<http::Response<B>, E>) -> Action {
        match outcome {
            Ok(r) if r.status() == StatusCode::CONFLICT => Action::Retry { after: None },
            other => HttpClassifier.classify(other),
        }
    }
}

fn quick_backoff() -> Backoff {
    Backoff::new(Duration::from_millis(1), 1.0, Duration::from_millis(1)).unwrap()
}

/// A response body that sends its first bytes and then never ends.
struct Endless {
    started: bool,
}

impl http_body::Body for Endless {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        if self.started {
            return std::task::Poll::Pending;
        }
        self.started = true;
        std::task::Poll::Ready(Some(Ok(http_body::Frame::data(Bytes::from_static(
            br#"{"id":"#,
        )))))
    }
}

#[tokio::test]
async fn a_success_whose_body_never_ends_is_still_sent() {
    let db = Schema::new().await;
    let outbox = db.outbox().await;
    let calls = Arc::new(Mutex::new(0));
    let counted = Arc::clone(&calls);
    let app = axum::Router::new().fallback(move || {
        *counted.lock().unwrap() += 1;
        async {
            let mut response =
                axum::response::Response::new(axum::body::Body::new(Endless { started: false }));
            *response.status_mut() = StatusCode::CREATED;
            response
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let uri: Uri = format!("http://{}/v1/send", listener.local_addr().unwrap())
        .parse()
        .unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    enqueue(&db, &outbox, "email", "order-7:mail", "{}").await;
    let sender = HttpSender::new(client()).route("email", Route::post(uri));
    // Sends are cut at 800 ms: reading the body stops before that, and the 201 stands.
    let relay = OutboxRelay::new(outbox, quick(), sender).unwrap();

    let report = relay.pass().await.unwrap();
    assert_eq!((report.sent, report.failed), (1, 0), "{report:?}");
    let (attempts, sent, _, _) = row(&db, "order-7:mail").await;
    assert_eq!((attempts, sent), (0, true));
    assert_eq!(*calls.lock().unwrap(), 1);
}

async fn enqueue_in(pool: &sqlx::PgPool, outbox: &Outbox, topic: &str, key: &str, payload: &str) {
    let mut tx = pool.begin().await.unwrap();
    outbox.enqueue(&mut tx, topic, key, payload).await.unwrap();
    tx.commit().await.unwrap();
}

/// A sender that hands each message to a task of its own (as a sender with a queue or a
/// pool of workers does) and runs `sender` there.
fn on_a_task<S>(
    sender: S,
) -> impl tower::Service<
    OutboxMessage,
    Response = S::Response,
    Error = S::Error,
    Future: Send + 'static,
> + Clone
       + Send
       + 'static
where
    S: tower::Service<OutboxMessage> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
    S::Error: Send + 'static,
{
    tower::service_fn(move |message: OutboxMessage| {
        let sender = sender.clone();
        async move {
            tokio::spawn(sender.oneshot(message))
                .await
                .expect("the send task")
        }
    })
}

fn every_300ms() -> Backoff {
    Backoff::new(Duration::from_millis(300), 1.0, Duration::from_millis(300))
        .unwrap()
        .jitter(Jitter::None)
}

/// The send's deadline reaches the HTTP request ("the deadline travels with the message too, for a
/// sender that hands it to a task"; `OutboxMessage` is a `Carrier`, retry crate docs): a retry
/// layer on the client below `HttpSender`, on another task, stops at it. A provider that always
/// answers `503`, a retry every 300 ms: within the deadline there is room for 3 requests (at 0, 300
/// and 600 ms). Was broken: `HttpSender` built the request without the message's extensions
/// (http/route.rs, `Route::request`), so the client made all 10 of its attempts, long after the
/// relay had cut the send at 800 ms and scheduled the row again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sender_on_another_task_stops_at_the_sends_deadline() {
    let db = Database::new().await;
    let outbox = db.outbox().await;
    let busy = (StatusCode::SERVICE_UNAVAILABLE, vec![], "busy");
    let provider = Provider::start(vec![busy; 20]).await;
    enqueue_in(&db.pool, &outbox, "email", "order-8:mail", "{}").await;
    let client = ServiceBuilder::new()
        .layer(
            RetryLayer::new()
                .no_budget()
                .max_attempts(10)
                .backoff(every_300ms())
                .into_http(),
        )
        .layer(HttpTimeoutLayer::new(Duration::from_secs(5)))
        .service(Client::builder(TokioExecutor::new()).build_http());
    let sender = on_a_task(HttpSender::new(client).route("email", provider.route()));
    // quick(): a 1 s lease, sends cut at 800 ms.
    let relay = OutboxRelay::new(outbox, quick(), sender).unwrap();

    let report = relay.pass().await.unwrap();
    assert_eq!((report.sent, report.failed), (0, 1), "{report:?}");
    // Long enough for all 10 attempts of a client that ignores the deadline (2.7 s).
    tokio::time::sleep(Duration::from_secs(4)).await;
    let seen = provider.seen().len();
    assert!(
        seen <= 3,
        "{seen} requests reached the provider for one send cut at 800 ms"
    );
}

/// Nested retries must not multiply (retry crate docs: the attempt's
/// mark travels with `OutboxMessage`): a `RetryLayer` around the sender marks each message as one
/// of its attempts, and a retry layer below, on the task the message was handed to, defers to it: 3
/// requests reach the provider. Was broken: `HttpSender` dropped the mark with the rest of the
/// message's extensions (http/route.rs, `Route::request`), so 3 outer attempts × 4 inner ones made
/// 12.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_above_and_below_a_sender_on_another_task_do_not_multiply() {
    let db = Database::new().await;
    let outbox = db.outbox().await;
    let busy = (StatusCode::SERVICE_UNAVAILABLE, vec![], "busy");
    let provider = Provider::start(vec![busy; 40]).await;
    enqueue_in(&db.pool, &outbox, "email", "order-9:mail", "{}").await;
    let client = ServiceBuilder::new()
        .layer(
            RetryLayer::new()
                .no_budget()
                .backoff(quick_backoff())
                .into_http(),
        )
        .layer(HttpTimeoutLayer::new(Duration::from_secs(5)))
        .service(Client::builder(TokioExecutor::new()).build_http());
    let sender = ServiceBuilder::new()
        .layer(
            RetryLayer::new()
                .no_budget()
                .max_attempts(3)
                .backoff(quick_backoff()),
        )
        .service(on_a_task(
            HttpSender::new(client).route("email", provider.route()),
        ));
    let relay = OutboxRelay::new(
        outbox,
        RelayConfig::new()
            .lease(Duration::from_secs(10))
            .backoff(quick_backoff()),
        sender,
    )
    .unwrap();

    let report = relay.pass().await.unwrap();
    assert_eq!(report.sent, 0, "{report:?}");
    let seen = provider.seen().len();
    assert_eq!(
        seen, 3,
        "one request per attempt of the outer retry layer, not {seen}"
    );
}

/// A client below the sender that retries and stamps keys
/// (`stamp_idempotency_keys(true)`) still sends the dedupe key, the same on every attempt and
/// every relay pass; `500`, `502`, `504` and `408` are never counted as sent, and the row
/// keeps its attempts until a `201` marks it sent once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_are_never_sent_and_every_attempt_carries_the_dedupe_key() {
    let db = Database::new().await;
    let outbox = db.outbox().await;
    let script = [
        StatusCode::INTERNAL_SERVER_ERROR,
        StatusCode::BAD_GATEWAY,
        StatusCode::GATEWAY_TIMEOUT,
        StatusCode::REQUEST_TIMEOUT,
    ]
    .map(|status| (status, vec![], "no"));
    let provider = Provider::start(script.to_vec()).await;
    enqueue_in(&db.pool, &outbox, "email", "order-10:mail", "{}").await;
    let client = ServiceBuilder::new()
        .layer(
            RetryLayer::new()
                .no_budget()
                .max_attempts(2)
                .backoff(quick_backoff())
                .into_http()
                .stamp_idempotency_keys(true),
        )
        .layer(HttpTimeoutLayer::new(Duration::from_secs(5)))
        .service(Client::builder(TokioExecutor::new()).build_http());
    let sender = HttpSender::new(client).route("email", provider.route());
    let relay = OutboxRelay::new(outbox.clone(), quick(), sender).unwrap();

    let first = relay.pass().await.unwrap();
    assert_eq!(
        (first.sent, first.failed),
        (0, 1),
        "500 then 502: {first:?}"
    );
    let second = pass_claiming(&relay).await;
    assert_eq!(
        (second.sent, second.failed),
        (0, 1),
        "504 then 408: {second:?}"
    );
    assert_eq!(outbox.stats().await.unwrap().sent, 0);
    let third = pass_claiming(&relay).await;
    assert_eq!(third.sent, 1, "{third:?}");
    let (attempts, sent, parked): (i32, bool, bool) = sqlx::query_as(
        "SELECT attempts, sent_at IS NOT NULL, parked_at IS NOT NULL FROM outbox \
         WHERE dedupe_key = 'order-10:mail'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!((attempts, sent, parked), (2, true, false));
    let keys: Vec<_> = provider.seen().into_iter().map(|s| s.key).collect();
    assert_eq!(
        keys,
        vec![Some("order-10:mail".to_owned()); 5],
        "one delivery, 5 requests"
    );
}

/// A `3xx` is not a delivery (the `http` module's table: only a
/// `2xx` marks the row sent): a provider that answers `308 Permanent Redirect` (an `http://` route
/// to a provider that moved to `https://`) accepted nothing, and the client does not follow it, so
/// the row is parked for a person, not marked sent. Was broken: the code made a `3xx` a delivery,
/// so the message was never delivered and never parked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirect_is_not_a_delivery() {
    let db = Database::new().await;
    let outbox = db.outbox().await;
    let moved = (
        StatusCode::PERMANENT_REDIRECT,
        vec![("location", "https://mail.example.com/v1/send")],
        "",
    );
    let provider = Provider::start(vec![moved]).await;
    enqueue_in(&db.pool, &outbox, "email", "order-11:mail", "{}").await;
    let sender = HttpSender::new(client()).route("email", provider.route());
    let relay = OutboxRelay::new(outbox.clone(), quick(), sender).unwrap();
    let report = relay.pass().await.unwrap();
    assert_eq!(provider.seen().len(), 1);
    assert_eq!(
        (report.sent, outbox.stats().await.unwrap().sent),
        (0, 0),
        "a 308 marked the message sent: {report:?}"
    );
    assert_eq!(report.parked, 1, "{report:?}");
}
