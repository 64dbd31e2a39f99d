//! Which answers are stored and which release the key (crate docs "What happens to a request",
//! step 6 and the rows "new key" (stored if 2xx, 3xx or 4xx but the released client errors),
//! "handler answered 5xx, 408, 425 or 429, or failed" and "handler answered 400, 413, 415 or 422";
//! the `predicate` module): a released key lets the next retry run the handler, a stored answer is
//! replayed, `store_when` replaces the rule, and a service error or a response body that fails
//! releases the key too. Paused time; every test counts handler runs.

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody};
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use tower::{Layer, Service, ServiceExt};
use tower_once_idempotency::{IdempotencyLayer, RequestBody};

mod support;

use support::{post, send, Handler};

#[tokio::test(start_paused = true)]
async fn server_errors_and_not_now_statuses_release_the_key() {
    for status in [500, 502, 503, 408, 425, 429] {
        let handler = Handler::default();
        let svc = IdempotencyLayer::new().layer(handler.clone());
        let uri = format!("/c?status={status}");
        let failed = send(&svc, post(&uri, Some("k"), "x")).await;
        assert_eq!(failed.status.as_u16(), status);
        assert!(!failed.replayed());
        let retried = send(&svc, post(&uri, Some("k"), "x")).await;
        assert_eq!(
            handler.runs(),
            2,
            "{status} released the key, so the retry ran"
        );
        assert!(!retried.replayed());
        assert!(
            svc.store_ref().is_empty(),
            "the released key left nothing behind"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn final_client_errors_are_stored_and_replayed() {
    for status in [401u16, 403, 404, 409, 410] {
        let handler = Handler::default();
        let svc = IdempotencyLayer::new().layer(handler.clone());
        let uri = format!("/c?status={status}");
        let first = send(&svc, post(&uri, Some("k"), "x")).await;
        assert_eq!(first.status.as_u16(), status);
        let again = send(&svc, post(&uri, Some("k"), "x")).await;
        assert_eq!(again.status.as_u16(), status);
        assert!(again.replayed(), "{status} is stored");
        assert_eq!(handler.runs(), 1);
    }
}

#[tokio::test(start_paused = true)]
async fn validation_rejections_are_not_stored_so_a_fixed_resend_runs() {
    // axum's own rejections (a missing Content-Type is 415, bad JSON 422, a bad query 400):
    // the client fixes its request and resends it with the same key.
    for status in [400u16, 413, 415, 422] {
        let handler = Handler::default();
        let svc = IdempotencyLayer::new().layer(handler.clone());
        let uri = format!("/c?status={status}");
        let first = send(&svc, post(&uri, Some("k"), "x")).await;
        assert_eq!(first.status.as_u16(), status);
        assert!(svc.store_ref().is_empty(), "{status} left no record");
        let again = send(&svc, post(&uri, Some("k"), "x")).await;
        assert!(!again.replayed());
        assert_eq!(handler.runs(), 2, "{status}: the resend ran");
    }
}

#[tokio::test(start_paused = true)]
async fn store_when_replaces_the_rule() {
    let handler = Handler::default();
    let svc = IdempotencyLayer::new()
        .store_when(|parts: &http::response::Parts| parts.status.is_success())
        .layer(handler.clone());
    send(&svc, post("/c?status=404", Some("k"), "x")).await;
    send(&svc, post("/c?status=404", Some("k"), "x")).await;
    assert_eq!(handler.runs(), 2, "a 404 is released under this rule");
}

#[tokio::test(start_paused = true)]
async fn inner_error_releases_the_key_and_is_returned() {
    let handler = Handler::default();
    let mut svc = IdempotencyLayer::new().layer(handler.clone());
    let err = svc
        .ready()
        .await
        .unwrap()
        .call(post("/c?fail", Some("k"), "x"))
        .await
        .unwrap_err();
    assert_eq!(err, "inner service failed");
    assert!(svc.store_ref().is_empty(), "the key was released");
    let ok = send(&svc, post("/c", Some("k"), "x")).await;
    // Different query, same key and path: the failed attempt left no record to mismatch.
    assert_eq!(ok.status, StatusCode::CREATED);
    assert_eq!(handler.runs(), 2);
}

#[tokio::test(start_paused = true)]
async fn failing_response_body_releases_the_key() {
    let runs = Arc::new(AtomicUsize::new(0));
    let inner = {
        let runs = runs.clone();
        tower::service_fn(move |_: Request<RequestBody<Full<Bytes>>>| {
            let run = runs.fetch_add(1, SeqCst);
            async move {
                let frames: Vec<_> = if run == 0 {
                    vec![
                        Ok(http_body::Frame::data(Bytes::from_static(b"half"))),
                        Err("upstream broke"),
                    ]
                } else {
                    vec![Ok(http_body::Frame::data(Bytes::from_static(b"whole")))]
                };
                Ok::<_, Infallible>(Response::new(StreamBody::new(futures_util::stream::iter(
                    frames,
                ))))
            }
        })
    };
    let mut svc = IdempotencyLayer::new().layer(inner);
    let res = svc
        .ready()
        .await
        .unwrap()
        .call(post("/c", Some("k"), "x"))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert!(svc.store_ref().is_empty(), "the key was released");
    let res = svc
        .ready()
        .await
        .unwrap()
        .call(post("/c", Some("k"), "x"))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.into_body().collect().await.unwrap().to_bytes(), "whole");
    assert_eq!(runs.load(SeqCst), 2, "the retry ran");
}
