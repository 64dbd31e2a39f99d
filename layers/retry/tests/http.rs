//! `HttpRetryLayer` (retry crate docs; crate docs "HTTP"): the
//! safe-request rule, key stamping, non-Clone bodies replayed byte for byte, over-limit bodies sent
//! once, the deadline in each attempt's extensions.

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tower::{Layer, ServiceExt};
use tower_once_core::body::BufferedBody as ReplayBody;
use tower_once_retry::http::HttpRetryLayer;
use tower_once_timeout::Deadline;

type Frames = std::vec::IntoIter<Result<http_body::Frame<Bytes>, &'static str>>;
/// A body that is not `Clone`: a stream of chunks, possibly ending in an error.
type Streamed = StreamBody<futures_util::stream::Iter<Frames>>;

fn streamed(chunks: &[&'static [u8]], fail: bool) -> Streamed {
    let mut frames: Vec<_> = chunks
        .iter()
        .map(|c| Ok(http_body::Frame::data(Bytes::from_static(c))))
        .collect();
    if fail {
        frames.push(Err("client reset"));
    }
    StreamBody::new(futures_util::stream::iter(frames))
}

/// What the upstream saw on each call: key header, body (or its error), deadline extension.
type Seen = Arc<Mutex<Vec<(Option<String>, Result<Bytes, String>, Option<Deadline>)>>>;

/// Answers the statuses in order (the last repeats) and records every request.
fn upstream(
    statuses: &'static [u16],
    seen: Seen,
) -> impl tower::Service<
    Request<ReplayBody<Streamed>>,
    Response = Response<()>,
    Error = Infallible,
    Future: Send,
> + Clone {
    tower::service_fn(move |req: Request<ReplayBody<Streamed>>| {
        let seen = seen.clone();
        async move {
            let key = req
                .headers()
                .get("idempotency-key")
                .map(|v| v.to_str().unwrap().to_owned());
            let deadline = req.extensions().get::<Deadline>().copied();
            let body = req
                .into_body()
                .collect()
                .await
                .map(|c| c.to_bytes())
                .map_err(|e| e.to_string());
            let n = {
                let mut seen = seen.lock().unwrap();
                seen.push((key, body, deadline));
                seen.len() - 1
            };
            let mut res = Response::new(());
            *res.status_mut() = StatusCode::from_u16(statuses[n.min(statuses.len() - 1)]).unwrap();
            Ok(res)
        }
    })
}

fn request(method: Method, key: Option<&str>, body: Streamed) -> Request<Streamed> {
    let mut builder = Request::builder()
        .method(method)
        .uri("http://upstream/charges");
    if let Some(key) = key {
        builder = builder.header("idempotency-key", key);
    }
    builder.body(body).unwrap()
}

fn layer() -> HttpRetryLayer {
    HttpRetryLayer::new()
}

#[tokio::test(start_paused = true)]
async fn an_unkeyed_post_is_sent_once() {
    let seen = Seen::default();
    let svc = layer().layer(upstream(&[503, 201], seen.clone()));
    let res = svc
        .oneshot(request(Method::POST, None, streamed(&[b"{}"], false)))
        .await
        .unwrap();
    assert_eq!(res.status(), 503, "not retried: the last (only) response");
    assert_eq!(seen.lock().unwrap().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_stamped_key_is_the_same_on_every_attempt() {
    let seen = Seen::default();
    let svc = layer()
        .stamp_idempotency_keys(true)
        .layer(upstream(&[503, 503, 201], seen.clone()));
    let res = svc
        .oneshot(request(Method::POST, None, streamed(&[b"{}"], false)))
        .await
        .unwrap();
    assert_eq!(res.status(), 201);
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 3);
    let key = seen[0].0.clone().expect("a key was stamped");
    assert_eq!(
        uuid::Uuid::parse_str(&key).map(|u| u.get_version_num()),
        Ok(4)
    );
    assert!(
        seen.iter()
            .all(|(k, _, _)| k.as_deref() == Some(key.as_str())),
        "one key for all attempts"
    );
}

#[tokio::test(start_paused = true)]
async fn a_callers_key_is_kept_and_makes_a_post_retryable() {
    let seen = Seen::default();
    let svc = layer()
        .stamp_idempotency_keys(true)
        .layer(upstream(&[503, 201], seen.clone()));
    svc.oneshot(request(
        Method::POST,
        Some("order-7"),
        streamed(&[b"{}"], false),
    ))
    .await
    .unwrap();
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 2);
    assert!(seen.iter().all(|(k, _, _)| k.as_deref() == Some("order-7")));
}

#[tokio::test(start_paused = true)]
async fn a_streaming_body_is_replayed_byte_for_byte() {
    let seen = Seen::default();
    let svc = layer().layer(upstream(&[503, 502, 200], seen.clone()));
    let chunks: [&'static [u8]; 3] = [b"{\"order\":", b"\"A\",\"amount\"", b":500}"];
    let res = svc
        .oneshot(request(Method::PUT, None, streamed(&chunks, false)))
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 3);
    for (_, body, _) in seen.iter() {
        assert_eq!(
            body.as_deref(),
            Ok(&b"{\"order\":\"A\",\"amount\":500}"[..])
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_body_over_the_limit_is_sent_once_in_full() {
    let seen = Seen::default();
    let svc = layer()
        .body_limit(8)
        .layer(upstream(&[503, 200], seen.clone()));
    let res = svc
        .oneshot(request(
            Method::PUT,
            None,
            streamed(&[b"12345", b"67890", b"abc"], false),
        ))
        .await
        .unwrap();
    assert_eq!(res.status(), 503, "not retried");
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 1);
    assert_eq!(
        seen[0].1.as_deref(),
        Ok(&b"1234567890abc"[..]),
        "nothing lost"
    );
}

#[tokio::test(start_paused = true)]
async fn a_failing_request_body_reaches_the_upstream_once_as_a_failure() {
    let seen = Seen::default();
    let svc = layer().layer(upstream(&[503, 200], seen.clone()));
    svc.oneshot(request(Method::PUT, None, streamed(&[b"part"], true)))
        .await
        .unwrap();
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 1, "a broken body is never replayed");
    assert_eq!(
        seen[0].1,
        Err("client reset".to_owned()),
        "and never passed off as complete"
    );
}

#[tokio::test(start_paused = true)]
async fn each_attempt_carries_the_operation_deadline() {
    let seen = Seen::default();
    let layer = tower_once_retry::RetryLayer::new()
        .classify(tower_once_retry::classify::HttpClassifier)
        .deadline(Duration::from_secs(5))
        .into_http();
    let started = tokio::time::Instant::now();
    layer
        .layer(upstream(&[503, 200], seen.clone()))
        .oneshot(request(Method::GET, None, streamed(&[], false)))
        .await
        .unwrap();
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 2);
    for (_, _, deadline) in seen.iter() {
        assert_eq!(
            *deadline,
            Some(Deadline::at(started + Duration::from_secs(5)))
        );
    }
}

/// An unkeyed `POST` marked `SafeToRetry` (an LLM completion, whose provider ignores keys) is
/// retried, and no key is sent, not even with stamping on.
#[tokio::test(start_paused = true)]
async fn a_post_marked_safe_to_retry_is_retried_without_a_key() {
    use tower_once_core::resend::SafeToRetry;
    let seen = Seen::default();
    let svc = layer()
        .stamp_idempotency_keys(true)
        .layer(upstream(&[503, 200], seen.clone()));
    let mut req = request(Method::POST, None, streamed(&[b"prompt"], false));
    req.extensions_mut().insert(SafeToRetry);
    let res = svc.clone().oneshot(req).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2, "retried");
    assert!(seen
        .iter()
        .all(|(key, body, _)| key.is_none() && body.as_deref() == Ok(&b"prompt"[..])));

    // Without the marker, the same unkeyed POST (no stamping) gets one attempt.
    let once = Seen::default();
    let svc = layer().layer(upstream(&[503, 200], once.clone()));
    let res = svc
        .oneshot(request(Method::POST, None, streamed(&[b"prompt"], false)))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(once.lock().unwrap().len(), 1);
}
