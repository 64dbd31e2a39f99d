//! tonic on both ends (retry crate docs "gRPC", `retry::tonic` docs), over real HTTP/2 on loopback:
//! `IdempotencyLayer` on a tonic server, `RetryLayer` + `HttpTimeoutLayer` on a tonic `Channel`;
//! replays keep their status, a duplicate in flight is `UNAVAILABLE` with pushback, scopes fail
//! closed as `UNAUTHENTICATED`. Messages are raw bytes (a codec of our own), so no protobuf tooling
//! is needed; generated code calls the same tonic APIs.
#![cfg(all(feature = "retry", feature = "timeout"))]

use bytes::{Buf, BufMut, Bytes};
use http::uri::PathAndQuery;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tonic::body::Body;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::transport::server::TcpIncoming;
use tonic::{Code, Status};
use tower::{Service, ServiceBuilder};
use tower_once::idempotency::IdempotencyLayer;
use tower_once::retry::tonic::{GrpcStatus, GrpcStatusLayer, TonicBody, TonicBodyLayer};
use tower_once::retry::{classify::HttpClassifier, RetryLayer};
use tower_once::timeout::http::HttpTimeoutLayer;

/// Messages are their bytes.
#[derive(Debug, Clone, Default)]
struct RawCodec;

impl Codec for RawCodec {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = RawCodec;
    type Decoder = RawCodec;

    fn encoder(&mut self) -> RawCodec {
        RawCodec
    }
    fn decoder(&mut self) -> RawCodec {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = Bytes;
    type Error = Status;
    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put(item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = Bytes;
    type Error = Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

/// `demo.Charges/Create`: the message says what to do. `unavailable-once` fails with
/// UNAVAILABLE on its first run; `invalid` is INVALID_ARGUMENT; `slow` takes 300 ms, `slower`
/// 1.5 s; anything
/// else is charged. Records each run and the `grpc-timeout` it was sent with.
#[derive(Clone, Default)]
struct Charges {
    /// Counts in `call` (for the Flaky method) rather than in the handler.
    flaky: bool,
    runs: Arc<AtomicUsize>,
    timeouts: Arc<Mutex<Vec<Option<String>>>>,
}

impl tonic::server::NamedService for Charges {
    const NAME: &'static str = "demo.Charges";
}

impl Service<http::Request<Body>> for Charges {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<http::Response<Body>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let this = self.clone();
        if req.uri().path() == "/demo.Charges/Flaky" && this.runs.fetch_add(1, SeqCst) == 0 {
            // Headers first, then UNAVAILABLE in the trailers (not trailers-only).
            let mut trailers = http::HeaderMap::new();
            trailers.insert("grpc-status", http::HeaderValue::from_static("14"));
            let frames = vec![Ok::<_, Status>(http_body::Frame::trailers(trailers))];
            let body = Body::new(http_body_util::StreamBody::new(futures_util::stream::iter(
                frames,
            )));
            let response = http::Response::builder()
                .header("content-type", "application/grpc")
                .body(body);
            return Box::pin(async move { Ok(response.unwrap()) });
        }
        Box::pin(async move {
            let handler = tower::service_fn(move |req: tonic::Request<Bytes>| {
                let this = this.clone();
                async move {
                    let run = if this.flaky {
                        this.runs.load(SeqCst)
                    } else {
                        this.runs.fetch_add(1, SeqCst)
                    };
                    let timeout = req
                        .metadata()
                        .get("grpc-timeout")
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_owned);
                    this.timeouts.lock().unwrap().push(timeout);
                    match req.get_ref().as_ref() {
                        b"unavailable-once" if run == 0 => Err(Status::unavailable("warming up")),
                        b"invalid" => Err(Status::invalid_argument("amount must be positive")),
                        b"slow" => {
                            tokio::time::sleep(Duration::from_millis(300)).await;
                            Ok(tonic::Response::new(Bytes::from(format!("charge #{run}"))))
                        }
                        b"slower" => {
                            tokio::time::sleep(Duration::from_millis(1500)).await;
                            Ok(tonic::Response::new(Bytes::from(format!("charge #{run}"))))
                        }
                        _ => Ok(tonic::Response::new(Bytes::from(format!("charge #{run}")))),
                    }
                }
            });
            let mut grpc = tonic::server::Grpc::new(RawCodec);
            Ok(grpc.unary(handler, req).await)
        })
    }
}

async fn server(charges: Charges) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .layer(IdempotencyLayer::new())
            .add_service(charges)
            .serve_with_incoming(TcpIncoming::from(listener)),
    );
    format!("http://{addr}")
}

/// A Channel takes tonic's own body type: the crate's adapter converts.
type Wire = TonicBody<tonic::transport::Channel>;

/// The client stack over `L`'s service (below the per-attempt timeout).
type ClientWith<S> = GrpcStatus<
    tower_once::retry::http::HttpRetry<tower_once::timeout::http::HttpTimeout<S>, HttpClassifier>,
>;

type Client = ClientWith<Wire>;

/// A tonic client: retries (stamping one idempotency key per call) over a per-attempt timeout
/// that sends `grpc-timeout`, over `extra` (for instance `GrpcTrailersLayer`), over a tonic
/// `Channel`.
async fn client_with<L: tower::Layer<Wire>>(url: String, extra: L) -> ClientWith<L::Service> {
    timed_client(url, extra, Duration::from_secs(5), Duration::from_secs(2)).await
}

/// The same stack with a chosen deadline (over all attempts) and per-attempt timeout.
async fn timed_client<L: tower::Layer<Wire>>(
    url: String,
    extra: L,
    deadline: Duration,
    per_attempt: Duration,
) -> ClientWith<L::Service> {
    let channel = tonic::transport::Channel::from_shared(url)
        .unwrap()
        .connect()
        .await
        .unwrap();
    ServiceBuilder::new()
        .layer(GrpcStatusLayer::new())
        .layer(
            RetryLayer::new()
                .classify(HttpClassifier)
                .deadline(deadline)
                .rng_seed(1)
                .into_http()
                .stamp_idempotency_keys(true),
        )
        .layer(HttpTimeoutLayer::new(per_attempt).propagate_grpc_timeout())
        .layer(extra)
        .layer(TonicBodyLayer::new())
        .service(channel)
}

async fn client(url: String) -> Client {
    client_with(url, tower::layer::util::Identity::new()).await
}

async fn create(
    client: &Client,
    message: &'static [u8],
    key: Option<&'static str>,
) -> Result<Bytes, Status> {
    call(client, "/demo.Charges/Create", message, key).await
}

async fn call<T>(
    client: &T,
    path: &'static str,
    message: &'static [u8],
    key: Option<&'static str>,
) -> Result<Bytes, Status>
where
    T: tonic::client::GrpcService<Body> + Clone,
    T::ResponseBody: axum::body::HttpBody<Data = Bytes> + Send + 'static,
    <T::ResponseBody as axum::body::HttpBody>::Error: Into<tower::BoxError>,
    T::Error: std::fmt::Display,
{
    let mut grpc = tonic::client::Grpc::new(client.clone());
    grpc.ready()
        .await
        .map_err(|e| Status::unknown(e.to_string()))?;
    let mut request = tonic::Request::new(Bytes::from_static(message));
    if let Some(key) = key {
        request
            .metadata_mut()
            .insert("idempotency-key", key.parse().unwrap());
    }
    let path = PathAndQuery::from_static(path);
    grpc.unary(request, path, RawCodec)
        .await
        .map(tonic::Response::into_inner)
}

#[tokio::test]
async fn unavailable_is_retried_and_the_server_sees_the_budget() {
    let charges = Charges::default();
    let client = client(server(charges.clone()).await).await;
    let reply = create(&client, b"unavailable-once", None).await.unwrap();
    assert_eq!(reply, "charge #1", "the second run answered");
    assert_eq!(
        charges.runs.load(SeqCst),
        2,
        "UNAVAILABLE released the key, so the retry ran"
    );
    let timeouts = charges.timeouts.lock().unwrap().clone();
    assert!(
        timeouts.iter().all(|t| t
            .as_deref()
            .is_some_and(|t| t.ends_with('u') || t.ends_with('m'))),
        "{timeouts:?}"
    );
}

#[tokio::test]
async fn a_repeated_key_replays_the_stored_status_and_message() {
    let charges = Charges::default();
    let client = client(server(charges.clone()).await).await;
    let first = create(&client, b"two widgets", Some("order-1"))
        .await
        .unwrap();
    let again = create(&client, b"two widgets", Some("order-1"))
        .await
        .unwrap();
    assert_eq!(first, again, "the replay carries the stored message");
    assert_eq!(charges.runs.load(SeqCst), 1);

    let invalid = create(&client, b"invalid", Some("order-2"))
        .await
        .unwrap_err();
    let replayed = create(&client, b"invalid", Some("order-2"))
        .await
        .unwrap_err();
    assert_eq!(
        (invalid.code(), replayed.code()),
        (Code::InvalidArgument, Code::InvalidArgument)
    );
    assert_eq!(
        replayed.message(),
        "amount must be positive",
        "the stored status replays, message and all"
    );
    assert_eq!(
        charges.runs.load(SeqCst),
        2,
        "INVALID_ARGUMENT is final: stored, not rerun"
    );
}

#[tokio::test]
async fn a_duplicate_in_flight_waits_for_the_pushback_and_gets_the_replay() {
    let charges = Charges::default();
    let client = client(server(charges.clone()).await).await;
    let first = {
        let client = client.clone();
        tokio::spawn(async move { create(&client, b"slow", Some("order-3")).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    // The server answers UNAVAILABLE + grpc-retry-pushback-ms (the lease left); the client's
    // retry layer waits that long, then gets the stored reply.
    let duplicate = create(&client, b"slow", Some("order-3")).await.unwrap();
    let first = first.await.unwrap().unwrap();
    assert_eq!(duplicate, first);
    assert_eq!(
        charges.runs.load(SeqCst),
        1,
        "the duplicate never ran the handler"
    );
}

#[tokio::test]
async fn unavailable_in_trailers_is_retried_with_the_trailers_layer() {
    let flaky = || Charges {
        flaky: true,
        ..Charges::default()
    };

    // Without the layer the status arrives after the classifier has seen the head: no retry.
    let charges = flaky();
    let plain = client(server(charges.clone()).await).await;
    let err = call(&plain, "/demo.Charges/Flaky", b"x", None)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unavailable);
    assert_eq!(charges.runs.load(SeqCst), 1);

    // With it, the trailers are read before classifying: retried, and the second call answers.
    let charges = flaky();
    let trailers_layer = tower_once::retry::grpc::GrpcTrailersLayer::new(64 * 1024);
    let reading = client_with(server(charges.clone()).await, trailers_layer).await;
    let reply = call(&reading, "/demo.Charges/Flaky", b"x", None)
        .await
        .unwrap();
    assert_eq!(
        reply, "charge #2",
        "the second call (counted in call) answered"
    );
    assert_eq!(charges.runs.load(SeqCst), 2);
}

#[tokio::test]
async fn a_call_cut_by_the_timeout_reaches_the_caller_as_deadline_exceeded() {
    let charges = Charges::default();
    let url = server(charges.clone()).await;
    let identity = tower::layer::util::Identity::new();
    // Every attempt is cut at 100 ms (the handler takes 300 ms); the operation at 250 ms.
    let client = timed_client(
        url,
        identity,
        Duration::from_millis(250),
        Duration::from_millis(100),
    )
    .await;
    let err = create(&client, b"slow", Some("order-9")).await.unwrap_err();
    assert_eq!(err.code(), Code::DeadlineExceeded, "{err:?}");
    // Was "transport error (1 attempt)": the message says what happened.
    let message = err.message();
    assert!(
        message.contains("attempt") && message.contains("may still complete"),
        "{message}"
    );
}

/// Was broken: a call still running on the server when the client's deadline came ended in
/// the server's `UNAVAILABLE "Request in progress"`. It is `DEADLINE_EXCEEDED`, saying the
/// call may still complete, with the key in the metadata; the key fetches the reply later.
#[tokio::test]
async fn a_call_still_running_at_the_deadline_is_deadline_exceeded_with_its_key() {
    let charges = Charges::default();
    let url = server(charges.clone()).await;
    let identity = tower::layer::util::Identity::new();
    let client = timed_client(
        url,
        identity,
        Duration::from_millis(1200),
        Duration::from_millis(300),
    )
    .await;
    let err = create(&client, b"slower", Some("order-10"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::DeadlineExceeded, "{err:?}");
    assert!(err.message().contains("may still complete"), "{err:?}");
    assert_eq!(
        err.metadata()
            .get("idempotency-key")
            .and_then(|v| v.to_str().ok()),
        Some("order-10")
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let reply = create(&client, b"slower", Some("order-10")).await.unwrap();
    assert_eq!(reply, "charge #0");
    assert_eq!(charges.runs.load(SeqCst), 1, "the handler ran once");
}

/// A call the server is still running when the client runs out of attempts (not time) ends as the
/// The retry crate docs promise (the `409` row: "... (gRPC:
/// `DEADLINE_EXCEEDED`, the key in its metadata)"), never as `UNAVAILABLE`, the status a gRPC
/// caller retries as "nothing happened" (with a freshly stamped key, a second charge). Was broken:
/// `GrpcStatusLayer` answered `UNAVAILABLE` (tonic.rs, `to_status`).
#[tokio::test]
async fn a_call_still_running_when_the_attempts_run_out_is_deadline_exceeded_with_its_key() {
    let charges = Charges::default();
    let url = server(charges.clone()).await;
    let first = {
        let client = client(url.clone()).await;
        tokio::spawn(async move { create(&client, b"slower", Some("order-11")).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Two attempts, a long deadline: the attempts run out (the pushback is about 1 s, the
    // handler takes 1.5 s).
    let channel = tonic::transport::Channel::from_shared(url)
        .unwrap()
        .connect()
        .await
        .unwrap();
    let impatient: Client = ServiceBuilder::new()
        .layer(GrpcStatusLayer::new())
        .layer(
            RetryLayer::new()
                .classify(HttpClassifier)
                .max_attempts(2)
                .deadline(Duration::from_secs(10))
                .into_http()
                .stamp_idempotency_keys(true),
        )
        .layer(HttpTimeoutLayer::new(Duration::from_secs(5)).propagate_grpc_timeout())
        .layer(TonicBodyLayer::new())
        .service(channel);
    let err = create(&impatient, b"slower", Some("order-11"))
        .await
        .unwrap_err();
    let first = first.await.unwrap().unwrap();
    assert_eq!(first, "charge #0");
    assert_eq!(
        charges.runs.load(SeqCst),
        1,
        "the duplicate never ran the handler"
    );
    assert!(err.message().contains("may still complete"), "{err:?}");
    assert_eq!(
        err.metadata()
            .get("idempotency-key")
            .and_then(|v| v.to_str().ok()),
        Some("order-11"),
        "{err:?}"
    );
    assert_eq!(err.code(), Code::DeadlineExceeded, "{err:?}");
}

/// Scopes fail closed over gRPC (the idempotency crate's `scope` module: "gRPC
/// `UNAUTHENTICATED`"): on a tonic server whose `IdempotencyLayer` is scoped by an
/// `x-tenant-id` header, a keyed call without the tenant is `UNAUTHENTICATED` and runs
/// nothing; two tenants with one key run their own calls; a tenant's repeat is replayed.
#[tokio::test]
async fn grpc_calls_without_a_tenant_are_unauthenticated_and_tenants_never_share() {
    let charges = Charges::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .layer(
                IdempotencyLayer::new().scope(tower_once::idempotency::scope::HeaderScope::new(
                    "x-tenant-id",
                )),
            )
            .add_service(charges.clone())
            .serve_with_incoming(TcpIncoming::from(listener)),
    );
    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let send = |tenant: Option<&'static str>| {
        let channel = channel.clone();
        async move {
            let mut grpc = tonic::client::Grpc::new(channel);
            grpc.ready().await.unwrap();
            let mut request = tonic::Request::new(Bytes::from_static(b"two widgets"));
            request
                .metadata_mut()
                .insert("idempotency-key", "order-12".parse().unwrap());
            if let Some(tenant) = tenant {
                request
                    .metadata_mut()
                    .insert("x-tenant-id", tenant.parse().unwrap());
            }
            grpc.unary(
                request,
                PathAndQuery::from_static("/demo.Charges/Create"),
                RawCodec,
            )
            .await
            .map(tonic::Response::into_inner)
        }
    };
    let refused = send(None).await.unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");
    assert_eq!(charges.runs.load(SeqCst), 0);
    let acme = send(Some("acme")).await.unwrap();
    let globex = send(Some("globex")).await.unwrap();
    let acme_again = send(Some("acme")).await.unwrap();
    assert_eq!(
        (acme.as_ref(), globex.as_ref()),
        (&b"charge #0"[..], &b"charge #1"[..])
    );
    assert_eq!(acme_again, acme, "replayed");
    assert_eq!(charges.runs.load(SeqCst), 2);
}
