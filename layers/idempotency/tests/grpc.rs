//! gRPC through the idempotency layer (crate docs "What happens to a request": gRPC clients get
//! gRPC statuses instead of problem documents, and a gRPC status in the response headers or
//! trailers decides storing the way an HTTP status does: a transient code such as `UNAVAILABLE`
//! releases the key, a final one is stored and replayed with its trailers). Unary calls to a
//! plain tower service with paused time; every test counts handler runs.

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody};
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use tower::{Layer, Service, ServiceExt};
use tower_once_idempotency::{IdempotencyLayer, RequestBody};

/// A gRPC response body: one message, then (maybe) trailers.
type GrpcBody = StreamBody<
    futures_util::stream::Iter<std::vec::IntoIter<Result<http_body::Frame<Bytes>, Infallible>>>,
>;

/// A unary gRPC handler: answers `codes[n]` on its n-th run (the last repeats), the status in the
/// trailers after one message, or alone in the headers (trailers-only) when `trailers_only`.
fn grpc_handler(
    codes: &'static [&'static str],
    trailers_only: bool,
    runs: Arc<AtomicUsize>,
) -> impl Service<
    Request<RequestBody<Full<Bytes>>>,
    Response = Response<GrpcBody>,
    Error = Infallible,
    Future: Send,
> + Clone {
    tower::service_fn(move |_req: Request<RequestBody<Full<Bytes>>>| {
        let n = runs.fetch_add(1, SeqCst);
        let code = codes[n.min(codes.len() - 1)];
        async move {
            let status = HeaderValue::from_static(code);
            let mut res = Response::new(StreamBody::new(futures_util::stream::iter(
                if trailers_only {
                    vec![]
                } else {
                    let mut trailers = HeaderMap::new();
                    trailers.insert("grpc-status", status.clone());
                    vec![
                        Ok(http_body::Frame::data(Bytes::from_static(
                            b"\0\0\0\0\x02hi",
                        ))),
                        Ok(http_body::Frame::trailers(trailers)),
                    ]
                },
            )));
            res.headers_mut()
                .insert("content-type", HeaderValue::from_static("application/grpc"));
            if trailers_only {
                res.headers_mut().insert("grpc-status", status);
            }
            Ok(res)
        }
    })
}

fn grpc_call(key: Option<&str>, message: &'static [u8]) -> Request<Full<Bytes>> {
    let mut builder =
        Request::post("/pkg.Charges/Create").header("content-type", "application/grpc");
    if let Some(key) = key {
        builder = builder.header("idempotency-key", key);
    }
    builder
        .body(Full::new(Bytes::from_static(message)))
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn grpc_failures_release_the_key_in_trailers_or_headers() {
    for trailers_only in [false, true] {
        let runs = Arc::new(AtomicUsize::new(0));
        let mut svc =
            IdempotencyLayer::new().layer(grpc_handler(&["14", "0"], trailers_only, runs.clone()));
        for expected in ["14", "0"] {
            let res = svc
                .ready()
                .await
                .unwrap()
                .call(grpc_call(Some("k"), b"msg"))
                .await
                .unwrap();
            let (parts, body) = res.into_parts();
            let collected = body.collect().await.unwrap();
            let code = parts
                .headers
                .get("grpc-status")
                .or(collected.trailers().and_then(|t| t.get("grpc-status")));
            assert_eq!(code.unwrap(), expected);
        }
        assert_eq!(
            runs.load(SeqCst),
            2,
            "UNAVAILABLE released the key (trailers_only: {trailers_only})"
        );
        let res = svc
            .ready()
            .await
            .unwrap()
            .call(grpc_call(Some("k"), b"msg"))
            .await
            .unwrap();
        assert!(
            res.headers().contains_key("idempotent-replayed"),
            "the OK answer is stored"
        );
        assert_eq!(runs.load(SeqCst), 2);
    }
}

#[tokio::test(start_paused = true)]
async fn final_grpc_codes_are_stored_and_replayed_with_their_trailers() {
    let runs = Arc::new(AtomicUsize::new(0));
    let mut svc = IdempotencyLayer::new().layer(grpc_handler(&["3"], false, runs.clone()));
    for replay in [false, true] {
        let res = svc
            .ready()
            .await
            .unwrap()
            .call(grpc_call(Some("k"), b"msg"))
            .await
            .unwrap();
        assert_eq!(res.headers().contains_key("idempotent-replayed"), replay);
        let collected = res.into_body().collect().await.unwrap();
        assert_eq!(
            collected.trailers().unwrap()["grpc-status"],
            "3",
            "INVALID_ARGUMENT replays"
        );
    }
    assert_eq!(runs.load(SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn grpc_clients_get_grpc_statuses_from_the_layer() {
    let runs = Arc::new(AtomicUsize::new(0));
    let svc = IdempotencyLayer::new()
        .require_key(true)
        .layer(grpc_handler(&["0"], false, runs.clone()));
    let status = |res: &Response<_>| {
        (
            res.status(),
            res.headers()["content-type"].clone(),
            res.headers()["grpc-status"].clone(),
        )
    };
    let missing = svc.clone().oneshot(grpc_call(None, b"msg")).await.unwrap();
    assert_eq!(
        status(&missing),
        (
            StatusCode::OK,
            HeaderValue::from_static("application/grpc"),
            HeaderValue::from_static("3")
        )
    );

    svc.clone()
        .oneshot(grpc_call(Some("k"), b"msg"))
        .await
        .unwrap()
        .into_body()
        .collect()
        .await
        .unwrap();
    let mismatch = svc
        .clone()
        .oneshot(grpc_call(Some("k"), b"other"))
        .await
        .unwrap();
    assert_eq!(
        mismatch.headers()["grpc-status"],
        "9",
        "FAILED_PRECONDITION"
    );
    assert_eq!(runs.load(SeqCst), 1);
}
