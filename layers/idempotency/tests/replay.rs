//! Replays and mismatches (crate docs "What happens to a request", the rows "same key, same
//! request, completed": the stored status, headers, body and trailers with `Idempotent-Replayed:
//! true`; "same key, same method and path, different query or body": `422`; "same key, different
//! method or path": a separate record; stored responses keep every header but hop-by-hop ones and
//! those named with `strip_header`), and a record's retention. Over a plain tower service with
//! paused time; every test asserts how many times the handler ran, not only the statuses.

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody};
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;
use tower::{Layer, Service, ServiceExt};
use tower_once_idempotency::{IdempotencyLayer, RequestBody};

mod support;

use support::{post, send, Handler};

#[tokio::test(start_paused = true)]
async fn first_request_runs_once_and_retries_replay_it() {
    let handler = Handler::default();
    let svc = IdempotencyLayer::new().layer(handler.clone());

    let first = send(&svc, post("/charges?x=1", Some("k1"), "{\"amount\":5}")).await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(first.body, "run 1: {\"amount\":5}");
    assert!(!first.replayed());
    assert_eq!(handler.runs(), 1);

    for _ in 0..3 {
        let again = send(&svc, post("/charges?x=1", Some("k1"), "{\"amount\":5}")).await;
        assert_eq!(handler.runs(), 1, "a retry never runs the handler again");
        assert!(again.replayed());
        assert_eq!(again.status, first.status);
        assert_eq!(again.body, first.body);
        let mut expected = first.headers.clone();
        for hop in ["connection", "x-hop", "keep-alive"] {
            expected.remove(hop);
        }
        expected.insert("idempotent-replayed", HeaderValue::from_static("true"));
        assert_eq!(
            again.headers, expected,
            "same headers, minus hop-by-hop, plus the replay mark"
        );
        let cookies: Vec<_> = again.headers.get_all("set-cookie").iter().collect();
        assert_eq!(cookies, ["a=1", "b=2"]);
    }
}

#[tokio::test(start_paused = true)]
async fn reusing_a_key_for_another_request_is_422_and_runs_nothing() {
    let handler = Handler::default();
    let svc = IdempotencyLayer::new().layer(handler.clone());
    send(&svc, post("/charges?x=1", Some("k"), "a")).await;

    let other_body = send(&svc, post("/charges?x=1", Some("k"), "b")).await;
    assert_eq!(other_body.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        other_body.problem_type(),
        "urn:tower-once:idempotency:fingerprint-mismatch"
    );
    let other_query = send(&svc, post("/charges?x=2", Some("k"), "a")).await;
    assert_eq!(other_query.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(handler.runs(), 1);

    // Another path is another record (the key is scoped by method and path).
    let other_path = send(&svc, post("/refunds", Some("k"), "a")).await;
    assert_eq!(other_path.status, StatusCode::CREATED);
    assert_eq!(handler.runs(), 2);
}

/// A deploy that changes the fingerprint's kind (the default was SHA-256, it is xxh3 now):
/// the records stored before it still replay to their retries, and still refuse another body.
#[tokio::test(start_paused = true)]
async fn a_record_stored_under_the_earlier_sha256_default_still_replays_after_an_upgrade() {
    use tower_once_idempotency::fingerprint::Sha256Fingerprint;
    use tower_once_idempotency::store::MemoryStore;
    let handler = Handler::default();
    let store = MemoryStore::new();
    let before = IdempotencyLayer::with_store(store.clone())
        .fingerprint_with(Sha256Fingerprint)
        .layer(handler.clone());
    let after = IdempotencyLayer::with_store(store).layer(handler.clone());
    let first = send(&before, post("/charges", Some("k"), "a")).await;
    assert_eq!(first.status, StatusCode::CREATED);
    let retry = send(&after, post("/charges", Some("k"), "a")).await;
    assert!(retry.replayed(), "{:?}", retry.status);
    assert_eq!(retry.body, first.body);
    let other = send(&after, post("/charges", Some("k"), "b")).await;
    assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(handler.runs(), 1);
}

#[tokio::test(start_paused = true)]
async fn the_layers_own_422_is_told_apart_from_a_handlers_by_its_problem_type() {
    let handler = Handler::default();
    let svc = IdempotencyLayer::new().layer(handler.clone());
    send(&svc, post("/c", Some("k"), "x")).await;
    let reused = send(&svc, post("/c", Some("k"), "other body")).await;
    assert_eq!(reused.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        reused.problem_type(),
        "urn:tower-once:idempotency:fingerprint-mismatch"
    );
    let handlers = send(&svc, post("/c?status=422", Some("k2"), "x")).await;
    assert_eq!(handlers.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_ne!(handlers.headers["content-type"], "application/problem+json");
}

#[tokio::test(start_paused = true)]
async fn strip_header_keeps_a_header_out_of_replays() {
    let handler = Handler::default();
    let svc = IdempotencyLayer::new()
        .strip_header(http::header::SET_COOKIE)
        .layer(handler.clone());
    let first = send(&svc, post("/c", Some("k"), "x")).await;
    assert_eq!(first.headers.get_all("set-cookie").iter().count(), 2);
    let again = send(&svc, post("/c", Some("k"), "x")).await;
    assert!(again.replayed());
    assert!(!again.headers.contains_key("set-cookie"));
    assert_eq!(handler.runs(), 1);
}

#[tokio::test(start_paused = true)]
async fn trailers_are_stored_and_replayed() {
    let runs = Arc::new(AtomicUsize::new(0));
    let inner = {
        let runs = runs.clone();
        tower::service_fn(move |_req: Request<RequestBody<Full<Bytes>>>| {
            runs.fetch_add(1, SeqCst);
            async move {
                let mut trailers = HeaderMap::new();
                trailers.insert("grpc-status", HeaderValue::from_static("0"));
                let frames = vec![
                    Ok::<_, Infallible>(http_body::Frame::data(Bytes::from_static(b"msg"))),
                    Ok(http_body::Frame::trailers(trailers)),
                ];
                Ok::<_, Infallible>(Response::new(StreamBody::new(futures_util::stream::iter(
                    frames,
                ))))
            }
        })
    };
    let mut svc = IdempotencyLayer::new().layer(inner);
    for replay in [false, true] {
        let res = svc
            .ready()
            .await
            .unwrap()
            .call(post("/rpc", Some("k"), "x"))
            .await
            .unwrap();
        assert_eq!(res.headers().contains_key("idempotent-replayed"), replay);
        let collected = res.into_body().collect().await.unwrap();
        assert_eq!(collected.trailers().unwrap()["grpc-status"], "0");
        assert_eq!(collected.to_bytes(), "msg");
    }
    assert_eq!(runs.load(SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn expired_retention_lets_the_key_run_again() {
    let handler = Handler::default();
    let svc = IdempotencyLayer::new()
        .retention(Duration::from_secs(3600))
        .layer(handler.clone());
    send(&svc, post("/c", Some("k"), "x")).await;
    tokio::time::advance(Duration::from_secs(3599)).await;
    assert!(send(&svc, post("/c", Some("k"), "x")).await.replayed());
    tokio::time::advance(Duration::from_secs(2)).await;
    let reused = send(&svc, post("/c", Some("k"), "y")).await;
    assert!(!reused.replayed());
    assert_eq!(
        reused.status,
        StatusCode::CREATED,
        "an expired key is free, even for a new body"
    );
    assert_eq!(handler.runs(), 2);
}
