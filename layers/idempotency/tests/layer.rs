//! What the idempotency layer answers (the idempotency crate docs' table, "What happens to a
//! request"), over a plain tower service with paused time: replays, conflicts, mismatches, released
//! and stored statuses, leases, retention, keys, limits, scopes, trailers and store failures. Every
//! test asserts how many times the handler ran, not only the statuses.

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody};
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;
use tower::{Layer, Service, ServiceExt};
use tower_once_idempotency::store::{
    ClaimOutcome, ClaimToken, Completion, IdempotencyStore, MemoryStore, StoreError, StoreKey,
};
use tower_once_idempotency::{fingerprint::Fingerprint, scope::HeaderScope};
use tower_once_idempotency::{IdempotencyLayer, RequestBody};

mod support;

use support::{Handler, Req};

fn post(uri: &str, key: Option<&str>, body: &'static str) -> Request<Full<Bytes>> {
    let mut builder = Request::post(uri);
    if let Some(key) = key {
        builder = builder.header("idempotency-key", key);
    }
    builder
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .unwrap()
}

struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

impl Answer {
    fn problem_type(&self) -> String {
        assert_eq!(self.headers["content-type"], "application/problem+json");
        let v: serde_json::Value = serde_json::from_slice(&self.body).unwrap();
        v["type"].as_str().unwrap().to_owned()
    }
    fn replayed(&self) -> bool {
        self.headers
            .get("idempotent-replayed")
            .is_some_and(|v| v == "true")
    }
}

async fn send<S>(svc: &mut S, req: Request<Full<Bytes>>) -> Answer
where
    S: Service<
        Request<Full<Bytes>>,
        Response = Response<tower_once_idempotency::ResponseBody<Full<Bytes>>>,
    >,
    S::Error: std::fmt::Debug,
{
    let res = svc.ready().await.unwrap().call(req).await.unwrap();
    let (parts, body) = res.into_parts();
    Answer {
        status: parts.status,
        headers: parts.headers,
        body: body.collect().await.unwrap().to_bytes(),
    }
}

fn layer() -> IdempotencyLayer {
    IdempotencyLayer::new()
}

#[tokio::test(start_paused = true)]
async fn first_request_runs_once_and_retries_replay_it() {
    let handler = Handler::default();
    let mut svc = layer().layer(handler.clone());

    let first = send(&mut svc, post("/charges?x=1", Some("k1"), "{\"amount\":5}")).await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(first.body, "run 1: {\"amount\":5}");
    assert!(!first.replayed());
    assert_eq!(handler.runs(), 1);

    for _ in 0..3 {
        let again = send(&mut svc, post("/charges?x=1", Some("k1"), "{\"amount\":5}")).await;
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
async fn quoted_and_bare_forms_of_a_key_are_the_same_key() {
    let handler = Handler::default();
    let mut svc = layer().layer(handler.clone());
    send(&mut svc, post("/c", Some("abc"), "x")).await;
    let again = send(&mut svc, post("/c", Some("\"abc\""), "x")).await;
    assert!(again.replayed());
    assert_eq!(handler.runs(), 1);
}

#[tokio::test(start_paused = true)]
async fn reusing_a_key_for_another_request_is_422_and_runs_nothing() {
    let handler = Handler::default();
    let mut svc = layer().layer(handler.clone());
    send(&mut svc, post("/charges?x=1", Some("k"), "a")).await;

    let other_body = send(&mut svc, post("/charges?x=1", Some("k"), "b")).await;
    assert_eq!(other_body.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        other_body.problem_type(),
        "urn:tower-once:idempotency:fingerprint-mismatch"
    );
    let other_query = send(&mut svc, post("/charges?x=2", Some("k"), "a")).await;
    assert_eq!(other_query.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(handler.runs(), 1);

    // Another path is another record (the key is scoped by method and path).
    let other_path = send(&mut svc, post("/refunds", Some("k"), "a")).await;
    assert_eq!(other_path.status, StatusCode::CREATED);
    assert_eq!(handler.runs(), 2);
}

#[tokio::test(start_paused = true)]
async fn duplicate_while_running_is_409_with_retry_after() {
    let handler = Handler::default();
    let svc = layer()
        .lease(Duration::from_secs(10))
        .layer(handler.clone());

    let mut first_svc = svc.clone();
    let first = tokio::spawn(async move {
        send(&mut first_svc, post("/c?sleep_ms=5000", Some("k"), "x")).await
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(handler.runs(), 1);

    let dup = send(&mut svc.clone(), post("/c?sleep_ms=5000", Some("k"), "x")).await;
    assert_eq!(dup.status, StatusCode::CONFLICT);
    assert_eq!(dup.problem_type(), "urn:tower-once:idempotency:in-progress");
    assert_eq!(
        dup.headers["retry-after"], "1",
        "a short hint (default 1 s), not the 10 s lease"
    );
    assert_eq!(handler.runs(), 1, "the duplicate did not run");

    let first = first.await.unwrap();
    assert_eq!(first.status, StatusCode::CREATED);
    let after = send(&mut svc.clone(), post("/c?sleep_ms=5000", Some("k"), "x")).await;
    assert!(after.replayed());
    assert_eq!(handler.runs(), 1);
}

#[tokio::test(start_paused = true)]
async fn the_in_progress_hint_is_configurable_and_capped_by_the_lease() {
    let handler = Handler::default();
    for (lease, hint, expected) in [(30, 3, "3"), (2, 60, "2")] {
        let svc = layer()
            .lease(Duration::from_secs(lease))
            .in_progress_retry_after(Duration::from_secs(hint))
            .layer(handler.clone());
        let mut first = svc.clone();
        let key = format!("k{lease}");
        let running = {
            let key = key.clone();
            tokio::spawn(
                async move { send(&mut first, post("/c?sleep_ms=500", Some(&key), "x")).await },
            )
        };
        tokio::task::yield_now().await;
        let dup = send(&mut svc.clone(), post("/c?sleep_ms=500", Some(&key), "x")).await;
        assert_eq!(dup.status, StatusCode::CONFLICT);
        assert_eq!(
            dup.headers["retry-after"], expected,
            "lease {lease} s, hint {hint} s"
        );
        running.await.unwrap();
    }
    assert_eq!(handler.runs(), 2);
}

#[tokio::test(start_paused = true)]
async fn slow_handler_keeps_its_claim_by_renewing_the_lease() {
    let handler = Handler::default();
    let svc = layer().lease(Duration::from_secs(3)).layer(handler.clone());

    let mut first_svc = svc.clone();
    let first = tokio::spawn(async move {
        send(&mut first_svc, post("/c?sleep_ms=20000", Some("k"), "x")).await
    });
    // Well past several leases: without renewal the key would be free by now.
    tokio::time::sleep(Duration::from_secs(15)).await;
    let dup = send(&mut svc.clone(), post("/c?sleep_ms=20000", Some("k"), "x")).await;
    assert_eq!(dup.status, StatusCode::CONFLICT);
    assert_eq!(handler.runs(), 1);

    assert_eq!(first.await.unwrap().status, StatusCode::CREATED);
    assert!(
        send(&mut svc.clone(), post("/c?sleep_ms=20000", Some("k"), "x"))
            .await
            .replayed()
    );
    assert_eq!(handler.runs(), 1);
}

#[tokio::test(start_paused = true)]
async fn server_errors_and_not_now_statuses_release_the_key() {
    for status in [500, 502, 503, 408, 425, 429] {
        let handler = Handler::default();
        let mut svc = layer().layer(handler.clone());
        let uri = format!("/c?status={status}");
        let failed = send(&mut svc, post(&uri, Some("k"), "x")).await;
        assert_eq!(failed.status.as_u16(), status);
        assert!(!failed.replayed());
        let retried = send(&mut svc, post(&uri, Some("k"), "x")).await;
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
        let mut svc = layer().layer(handler.clone());
        let uri = format!("/c?status={status}");
        let first = send(&mut svc, post(&uri, Some("k"), "x")).await;
        assert_eq!(first.status.as_u16(), status);
        let again = send(&mut svc, post(&uri, Some("k"), "x")).await;
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
        let mut svc = layer().layer(handler.clone());
        let uri = format!("/c?status={status}");
        let first = send(&mut svc, post(&uri, Some("k"), "x")).await;
        assert_eq!(first.status.as_u16(), status);
        assert!(svc.store_ref().is_empty(), "{status} left no record");
        let again = send(&mut svc, post(&uri, Some("k"), "x")).await;
        assert!(!again.replayed());
        assert_eq!(handler.runs(), 2, "{status}: the resend ran");
    }
}

#[tokio::test(start_paused = true)]
async fn the_layers_own_422_is_told_apart_from_a_handlers_by_its_problem_type() {
    let handler = Handler::default();
    let mut svc = layer().layer(handler.clone());
    send(&mut svc, post("/c", Some("k"), "x")).await;
    let reused = send(&mut svc, post("/c", Some("k"), "other body")).await;
    assert_eq!(reused.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        reused.problem_type(),
        "urn:tower-once:idempotency:fingerprint-mismatch"
    );
    let handlers = send(&mut svc, post("/c?status=422", Some("k2"), "x")).await;
    assert_eq!(handlers.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_ne!(handlers.headers["content-type"], "application/problem+json");
}

#[tokio::test(start_paused = true)]
async fn store_when_replaces_the_rule() {
    let handler = Handler::default();
    let mut svc = layer()
        .store_when(|parts: &http::response::Parts| parts.status.is_success())
        .layer(handler.clone());
    send(&mut svc, post("/c?status=404", Some("k"), "x")).await;
    send(&mut svc, post("/c?status=404", Some("k"), "x")).await;
    assert_eq!(handler.runs(), 2, "a 404 is released under this rule");
}

#[tokio::test(start_paused = true)]
async fn inner_error_releases_the_key_and_is_returned() {
    let handler = Handler::default();
    let mut svc = layer().layer(handler.clone());
    let err = svc
        .ready()
        .await
        .unwrap()
        .call(post("/c?fail", Some("k"), "x"))
        .await
        .unwrap_err();
    assert_eq!(err, "inner service failed");
    assert!(svc.store_ref().is_empty(), "the key was released");
    let ok = send(&mut svc, post("/c", Some("k"), "x")).await;
    // Different query, same key and path: the failed attempt left no record to mismatch.
    assert_eq!(ok.status, StatusCode::CREATED);
    assert_eq!(handler.runs(), 2);
}

#[tokio::test(start_paused = true)]
async fn client_gone_mid_run_still_finishes_the_handler_and_the_retry_is_replayed() {
    let handler = Handler::default();
    let mut svc = layer().layer(handler.clone());
    let mut pending = Box::pin(svc.ready().await.unwrap().call(post(
        "/c?sleep_ms=5000",
        Some("k"),
        "x",
    )));
    assert!(futures_util::poll!(pending.as_mut()).is_pending());
    assert_eq!(handler.runs(), 1);
    assert_eq!(svc.store_ref().len(), 1, "claimed while running");
    drop(pending); // the client went away (timed out, disconnected)
    tokio::task::yield_now().await;
    assert_eq!(svc.store_ref().len(), 1, "the key is still held");

    let early = send(&mut svc, post("/c?sleep_ms=5000", Some("k"), "x")).await;
    assert_eq!(early.status, StatusCode::CONFLICT, "still running");

    tokio::time::sleep(Duration::from_secs(6)).await;
    let retry = send(&mut svc, post("/c?sleep_ms=5000", Some("k"), "x")).await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert!(retry.replayed());
    assert_eq!(handler.runs(), 1, "the effect happened once");
}

#[tokio::test(start_paused = true)]
async fn cancel_on_disconnect_drops_the_handler_and_releases_the_key() {
    let handler = Handler::default();
    let mut svc = layer().cancel_on_disconnect(true).layer(handler.clone());
    let mut pending = Box::pin(svc.ready().await.unwrap().call(post(
        "/c?sleep_ms=60000",
        Some("k"),
        "x",
    )));
    assert!(futures_util::poll!(pending.as_mut()).is_pending());
    assert_eq!(handler.runs(), 1);
    drop(pending);
    tokio::task::yield_now().await;
    assert!(svc.store_ref().is_empty(), "dropping released the key");

    let retry = send(&mut svc, post("/c", Some("k"), "x")).await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert_eq!(handler.runs(), 2, "the client's retry ran");
}

#[tokio::test(start_paused = true)]
async fn a_crashed_owner_frees_the_key_after_one_lease() {
    let handler = Handler::default();
    let lease = Duration::from_secs(10);
    let mut svc = layer().lease(lease).layer(handler.clone());
    // A "crash": the request's future is never polled again and never dropped, so it neither
    // renews nor releases its claim.
    let mut crashed = Box::pin(svc.ready().await.unwrap().call(post(
        "/c?sleep_ms=600000",
        Some("k"),
        "x",
    )));
    assert!(futures_util::poll!(crashed.as_mut()).is_pending());
    std::mem::forget(crashed);
    assert_eq!(handler.runs(), 1);

    tokio::time::advance(lease / 2).await;
    let early = send(&mut svc, post("/c?sleep_ms=600000", Some("k"), "x")).await;
    assert_eq!(
        early.status,
        StatusCode::CONFLICT,
        "within the lease the key is held"
    );
    assert_eq!(handler.runs(), 1);

    tokio::time::advance(lease).await;
    let late = send(&mut svc, post("/c?sleep_ms=600000", Some("k"), "x")).await;
    assert_eq!(
        late.status,
        StatusCode::CREATED,
        "after the lease the retry runs"
    );
    assert_eq!(handler.runs(), 2);
}

#[tokio::test(start_paused = true)]
async fn expired_retention_lets_the_key_run_again() {
    let handler = Handler::default();
    let mut svc = layer()
        .retention(Duration::from_secs(3600))
        .layer(handler.clone());
    send(&mut svc, post("/c", Some("k"), "x")).await;
    tokio::time::advance(Duration::from_secs(3599)).await;
    assert!(send(&mut svc, post("/c", Some("k"), "x")).await.replayed());
    tokio::time::advance(Duration::from_secs(2)).await;
    let reused = send(&mut svc, post("/c", Some("k"), "y")).await;
    assert!(!reused.replayed());
    assert_eq!(
        reused.status,
        StatusCode::CREATED,
        "an expired key is free, even for a new body"
    );
    assert_eq!(handler.runs(), 2);
}

#[tokio::test(start_paused = true)]
async fn uncovered_methods_and_keyless_requests_pass_through() {
    let handler = Handler::default();
    let mut svc = layer().layer(handler.clone());
    for _ in 0..2 {
        let get = Request::get("/c")
            .header("idempotency-key", "k")
            .body(Full::default())
            .unwrap();
        let res = send(&mut svc, get).await;
        assert!(!res.replayed());
        assert!(
            res.headers.contains_key("connection"),
            "passed through untouched"
        );
        send(&mut svc, post("/c", None, "x")).await;
    }
    assert_eq!(handler.runs(), 4);
    assert!(svc.store_ref().is_empty(), "nothing was recorded");

    let mut put_covered = layer().methods([http::Method::PUT]).layer(handler.clone());
    let put = || {
        Request::put("/c")
            .header("idempotency-key", "k")
            .body(Full::default())
            .unwrap()
    };
    send(&mut put_covered, put()).await;
    assert!(send(&mut put_covered, put()).await.replayed());
    assert_eq!(handler.runs(), 5);
}

#[tokio::test(start_paused = true)]
async fn required_missing_and_invalid_keys_are_400() {
    let handler = Handler::default();
    let mut svc = layer().require_key(true).layer(handler.clone());
    let missing = send(&mut svc, post("/c", None, "x")).await;
    assert_eq!(missing.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        missing.problem_type(),
        "urn:tower-once:idempotency:missing-key"
    );

    for bad in ["", "a b", "\"open", &"k".repeat(256)] {
        let res = send(&mut svc, post("/c", Some(bad), "x")).await;
        assert_eq!(res.status, StatusCode::BAD_REQUEST, "{bad:?}");
        assert_eq!(res.problem_type(), "urn:tower-once:idempotency:invalid-key");
    }
    let mut twice = post("/c", Some("a"), "x");
    twice
        .headers_mut()
        .append("idempotency-key", HeaderValue::from_static("b"));
    let res = send(&mut svc, twice).await;
    assert_eq!(res.problem_type(), "urn:tower-once:idempotency:invalid-key");
    assert_eq!(handler.runs(), 0);
    assert!(svc.store_ref().is_empty());
}

#[tokio::test(start_paused = true)]
async fn oversized_bodies_are_413_before_the_handler() {
    let handler = Handler::default();
    let mut svc = layer().body_limit(8).layer(handler.clone());

    let declared = Request::post("/c")
        .header("idempotency-key", "k")
        .header("content-length", "9")
        .body(Full::new(Bytes::from_static(b"123456789")))
        .unwrap();
    let res = send(&mut svc, declared).await;
    assert_eq!(res.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(
        res.problem_type(),
        "urn:tower-once:idempotency:body-too-large"
    );
    assert_eq!(handler.runs(), 0);
    assert!(svc.store_ref().is_empty(), "nothing claimed");

    // Exactly at the limit is fine.
    let ok = send(&mut svc, post("/c", Some("k"), "12345678")).await;
    assert_eq!(ok.status, StatusCode::CREATED);
    assert_eq!(handler.runs(), 1);
}

#[tokio::test(start_paused = true)]
async fn streamed_bodies_are_counted_while_buffered() {
    type Frames = std::vec::IntoIter<Result<http_body::Frame<Bytes>, Infallible>>;
    type Chunks = StreamBody<futures_util::stream::Iter<Frames>>;
    let runs = Arc::new(AtomicUsize::new(0));
    let inner = {
        let runs = runs.clone();
        tower::service_fn(move |req: Request<RequestBody<Chunks>>| {
            runs.fetch_add(1, SeqCst);
            async move {
                let body = req
                    .into_body()
                    .collect()
                    .await
                    .map_err(|_| "body")?
                    .to_bytes();
                Ok::<_, &'static str>(Response::new(Full::new(body)))
            }
        })
    };
    let mut svc = layer().body_limit(10).layer(inner);
    let streamed = |chunks: &[&'static str]| {
        let frames = chunks
            .iter()
            .map(|c| Ok(http_body::Frame::data(Bytes::from_static(c.as_bytes()))));
        Request::post("/c")
            .header("idempotency-key", "s")
            .body(StreamBody::new(futures_util::stream::iter(
                frames.collect::<Vec<_>>(),
            )))
            .unwrap()
    };
    let res = svc
        .ready()
        .await
        .unwrap()
        .call(streamed(&["12345", "67890", "X"]))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(runs.load(SeqCst), 0);

    let res = svc
        .ready()
        .await
        .unwrap()
        .call(streamed(&["12345", "67890"]))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(
        res.into_body().collect().await.unwrap().to_bytes(),
        "1234567890",
        "chunks joined in order"
    );
    assert_eq!(runs.load(SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn tenants_with_the_same_key_are_independent() {
    let handler = Handler::default();
    let mut svc = layer()
        .scope(HeaderScope::new("x-tenant-id"))
        .layer(handler.clone());
    let as_tenant = |tenant: &str, body: &'static str| {
        let mut req = post("/c", Some("shared-key"), body);
        req.headers_mut()
            .insert("x-tenant-id", tenant.parse().unwrap());
        req
    };
    let a = send(&mut svc, as_tenant("a", "from a")).await;
    let b = send(&mut svc, as_tenant("b", "from b")).await;
    assert_eq!(handler.runs(), 2, "each tenant's first request runs");
    assert!(!b.replayed(), "tenant b never sees tenant a's response");
    assert_eq!(send(&mut svc, as_tenant("a", "from a")).await.body, a.body);
    assert_eq!(send(&mut svc, as_tenant("b", "from b")).await.body, b.body);
    assert_eq!(handler.runs(), 2);
}

#[tokio::test(start_paused = true)]
async fn oversized_response_reaches_its_caller_and_is_never_rerun() {
    let handler = Handler::default();
    let mut svc = layer().response_limit(1000).layer(handler.clone());
    let first = send(&mut svc, post("/c?big=5000", Some("k"), "x")).await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(
        first.body.len(),
        5000,
        "the first caller gets the whole response"
    );
    // The claim of a streamed response is finished by its own task once the body ended.
    tokio::task::yield_now().await;
    let dup = send(&mut svc, post("/c?big=5000", Some("k"), "x")).await;
    assert_eq!(dup.status, StatusCode::CONFLICT);
    assert_eq!(
        dup.problem_type(),
        "urn:tower-once:idempotency:not-replayable"
    );
    assert!(
        !dup.headers.contains_key("retry-after"),
        "retrying cannot help"
    );
    assert_eq!(handler.runs(), 1);
}

/// Was broken: when the memory store's bytes were full, a new response made room by
/// forgetting older records, so the retry of an older key ran its handler a second time. Now
/// the older record only loses its response: its retry is `409 not-replayable`, never a run.
#[tokio::test(start_paused = true)]
async fn byte_pressure_drops_old_responses_but_never_reruns_their_handlers() {
    use tower_once_idempotency::store::MemoryStore;
    let handler = Handler::default();
    // 10 entries: one shard, so the whole byte bound applies to these keys.
    let store = MemoryStore::builder()
        .max_entries(10)
        .max_bytes(1_000)
        .build();
    let mut svc = layer().store(store).layer(handler.clone());
    let first = send(&mut svc, post("/c?big=600", Some("old"), "x")).await;
    assert_eq!(first.status, StatusCode::CREATED);
    let second = send(&mut svc, post("/c?big=600", Some("new"), "x")).await;
    assert_eq!(second.status, StatusCode::CREATED);
    assert_eq!(handler.runs(), 2);

    let replay = send(&mut svc, post("/c?big=600", Some("new"), "x")).await;
    assert!(replay.replayed(), "the newer response is kept");
    let retry = send(&mut svc, post("/c?big=600", Some("old"), "x")).await;
    assert_eq!(retry.status, StatusCode::CONFLICT);
    assert_eq!(
        retry.problem_type(),
        "urn:tower-once:idempotency:not-replayable"
    );
    assert_eq!(handler.runs(), 2, "the older key's handler ran again");
}

#[tokio::test(start_paused = true)]
async fn handler_sees_its_claim_token() {
    let handler = Handler::default();
    let mut svc = layer().layer(handler.clone());
    send(&mut svc, post("/c?status=500", Some("k"), "x")).await;
    send(&mut svc, post("/c", Some("k"), "x")).await;
    send(&mut svc, post("/c", None, "x")).await;
    let tokens = handler.tokens.lock().unwrap().clone();
    assert_eq!(
        tokens.len(),
        2,
        "keyed runs carry a token, unkeyed ones do not"
    );
    assert_ne!(tokens[0], tokens[1], "each claim has its own token");
}

#[tokio::test(start_paused = true)]
async fn strip_header_keeps_a_header_out_of_replays() {
    let handler = Handler::default();
    let mut svc = layer()
        .strip_header(http::header::SET_COOKIE)
        .layer(handler.clone());
    let first = send(&mut svc, post("/c", Some("k"), "x")).await;
    assert_eq!(first.headers.get_all("set-cookie").iter().count(), 2);
    let again = send(&mut svc, post("/c", Some("k"), "x")).await;
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
    let mut svc = layer().layer(inner);
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

/// A store that is down: every operation fails.
#[derive(Clone)]
struct DownStore;

type Failing<T> = std::future::Ready<Result<T, StoreError>>;

impl IdempotencyStore for DownStore {
    type ClaimFuture = Failing<ClaimOutcome>;
    type CompleteFuture = Failing<bool>;
    type ReleaseFuture = Failing<bool>;
    type ExtendFuture = Failing<bool>;

    fn claim(&self, _: StoreKey, _: ClaimToken, _: Fingerprint, _: Duration) -> Self::ClaimFuture {
        std::future::ready(Err(StoreError::unavailable("connection refused")))
    }
    fn complete(
        &self,
        _: StoreKey,
        _: ClaimToken,
        _: Completion,
        _: Duration,
    ) -> Self::CompleteFuture {
        std::future::ready(Err(StoreError::timeout()))
    }
    fn release(&self, _: StoreKey, _: ClaimToken) -> Self::ReleaseFuture {
        std::future::ready(Err(StoreError::timeout()))
    }
    fn extend(&self, _: StoreKey, _: ClaimToken, _: Duration) -> Self::ExtendFuture {
        std::future::ready(Err(StoreError::timeout()))
    }
}

#[tokio::test(start_paused = true)]
async fn store_failure_fails_closed_unless_configured_open() {
    let handler = Handler::default();
    let mut closed = IdempotencyLayer::with_store(DownStore)
        .unavailable_retry_after(Duration::from_secs(5))
        .layer(handler.clone());
    let res = send(&mut closed, post("/c", Some("k"), "x")).await;
    assert_eq!(res.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        res.problem_type(),
        "urn:tower-once:idempotency:store-unavailable"
    );
    assert_eq!(res.headers["retry-after"], "5");
    assert_eq!(
        handler.runs(),
        0,
        "fail-closed never runs the handler without a claim"
    );

    let mut open = IdempotencyLayer::with_store(DownStore)
        .fail_open(true)
        .layer(handler.clone());
    let res = send(&mut open, post("/c", Some("k"), "x")).await;
    assert_eq!(res.status, StatusCode::CREATED);
    assert_eq!(handler.runs(), 1, "fail-open runs it, unclaimed");
}

#[tokio::test(start_paused = true)]
async fn full_store_answers_503_and_runs_nothing() {
    let handler = Handler::default();
    let store = MemoryStore::builder().max_entries(1).build();
    let svc = IdempotencyLayer::with_store(store).layer(handler.clone());
    let mut holder = svc.clone();
    let running =
        tokio::spawn(
            async move { send(&mut holder, post("/c?sleep_ms=1000", Some("a"), "x")).await },
        );
    tokio::time::sleep(Duration::from_millis(10)).await;
    let refused = send(&mut svc.clone(), post("/c", Some("b"), "x")).await;
    assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        handler.runs(),
        1,
        "only the request holding the one slot ran"
    );
    assert_eq!(running.await.unwrap().status, StatusCode::CREATED);
    // Now the slot holds a completed record, which a new key may evict.
    assert_eq!(
        send(&mut svc.clone(), post("/c", Some("b"), "x"))
            .await
            .status,
        StatusCode::CREATED
    );
    assert_eq!(handler.runs(), 2);
}

#[tokio::test(start_paused = true)]
async fn many_concurrent_duplicates_run_the_handler_once() {
    let handler = Handler::default();
    let svc = layer().layer(handler.clone());
    let tasks: Vec<_> = (0..200)
        .map(|_| {
            let mut svc = svc.clone();
            tokio::spawn(
                async move { send(&mut svc, post("/c?sleep_ms=50", Some("same"), "x")).await },
            )
        })
        .collect();
    let mut created = 0;
    for task in tasks {
        let res = task.await.unwrap();
        match res.status {
            StatusCode::CREATED => created += 1,
            StatusCode::CONFLICT => {
                assert_eq!(res.problem_type(), "urn:tower-once:idempotency:in-progress")
            }
            other => panic!("unexpected {other}"),
        }
    }
    assert_eq!(handler.runs(), 1);
    assert!(created >= 1);
}

/// Body frames that may fail.
type FailingFrames = std::vec::IntoIter<Result<http_body::Frame<Bytes>, &'static str>>;

#[tokio::test(start_paused = true)]
async fn unreadable_request_body_is_400_and_runs_nothing() {
    let runs = Arc::new(AtomicUsize::new(0));
    let inner = {
        let runs = runs.clone();
        tower::service_fn(
            move |_: Request<
                RequestBody<StreamBody<futures_util::stream::Iter<FailingFrames>>>,
            >| {
                runs.fetch_add(1, SeqCst);
                async { Ok::<_, Infallible>(Response::new(Full::<Bytes>::default())) }
            },
        )
    };
    let mut svc = layer().layer(inner);
    let frames = vec![
        Ok(http_body::Frame::data(Bytes::from_static(b"part"))),
        Err("connection reset"),
    ];
    let req = Request::post("/c")
        .header("idempotency-key", "k")
        .body(StreamBody::new(futures_util::stream::iter(frames)))
        .unwrap();
    let res = svc.ready().await.unwrap().call(req).await.unwrap();
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    assert_eq!(runs.load(SeqCst), 0);
    assert!(svc.store_ref().is_empty(), "nothing was claimed");
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
    let mut svc = layer().layer(inner);
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
        let mut svc = layer().layer(grpc_handler(&["14", "0"], trailers_only, runs.clone()));
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
    let mut svc = layer().layer(grpc_handler(&["3"], false, runs.clone()));
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
    let svc = layer()
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

/// A memory store whose claims answer after 100 ms, like a store across a network: the claim
/// takes effect when it arrives; the answer is what is in flight.
#[derive(Clone)]
struct SlowClaims(MemoryStore);

type Boxed<T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send>>;

impl IdempotencyStore for SlowClaims {
    type ClaimFuture = Boxed<ClaimOutcome>;
    type CompleteFuture = <MemoryStore as IdempotencyStore>::CompleteFuture;
    type ReleaseFuture = <MemoryStore as IdempotencyStore>::ReleaseFuture;
    type ExtendFuture = <MemoryStore as IdempotencyStore>::ExtendFuture;

    fn claim(
        &self,
        key: StoreKey,
        token: ClaimToken,
        fp: Fingerprint,
        lease: Duration,
    ) -> Self::ClaimFuture {
        let landed = self.0.claim(key, token, fp, lease);
        Box::pin(async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            landed.await
        })
    }
    fn complete(
        &self,
        key: StoreKey,
        token: ClaimToken,
        c: Completion,
        r: Duration,
    ) -> Self::CompleteFuture {
        self.0.complete(key, token, c, r)
    }
    fn release(&self, key: StoreKey, token: ClaimToken) -> Self::ReleaseFuture {
        self.0.release(key, token)
    }
    fn extend(&self, key: StoreKey, token: ClaimToken, lease: Duration) -> Self::ExtendFuture {
        self.0.extend(key, token, lease)
    }
}

#[tokio::test(start_paused = true)]
async fn dropping_the_request_while_its_claim_is_in_flight_frees_the_key() {
    let memory = MemoryStore::new();
    let handler = Handler::default();
    let mut svc = IdempotencyLayer::with_store(SlowClaims(memory.clone())).layer(handler.clone());
    let mut pending = Box::pin(svc.ready().await.unwrap().call(post("/c", Some("k"), "x")));
    assert!(
        futures_util::poll!(pending.as_mut()).is_pending(),
        "the claim is in flight"
    );
    drop(pending); // the client went away before the store answered
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert!(
        memory.is_empty(),
        "the claim that landed was released, not left for a lease"
    );

    let retry = send(&mut svc, post("/c", Some("k"), "x")).await;
    assert_eq!(
        retry.status,
        StatusCode::CREATED,
        "the retry runs at once, no 409"
    );
    assert_eq!(handler.runs(), 1);
}

type Frames =
    futures_util::stream::Iter<std::vec::IntoIter<Result<http_body::Frame<Bytes>, &'static str>>>;

/// A handler whose response streams 4 KiB and then fails, or ends cleanly.
fn streaming_handler(
    runs: Arc<AtomicUsize>,
    fail: bool,
) -> impl Service<
    Req,
    Response = Response<StreamBody<Frames>>,
    Error = &'static str,
    Future = impl Future<Output = Result<Response<StreamBody<Frames>>, &'static str>> + Send,
> + Clone
       + Send
       + 'static {
    tower::service_fn(move |_req: Req| {
        runs.fetch_add(1, SeqCst);
        let mut frames: Vec<Result<http_body::Frame<Bytes>, &'static str>> = (0..4)
            .map(|_| Ok(http_body::Frame::data(Bytes::from(vec![b'x'; 1024]))))
            .collect();
        if fail {
            frames.push(Err("the response body failed"));
        }
        async move {
            Ok(Response::new(StreamBody::new(futures_util::stream::iter(
                frames,
            ))))
        }
    })
}

#[tokio::test(start_paused = true)]
async fn an_over_limit_response_that_fails_mid_stream_releases_the_key() {
    let runs = Arc::new(AtomicUsize::new(0));
    let mut svc = layer()
        .response_limit(1024)
        .layer(streaming_handler(runs.clone(), true));
    let res = svc
        .ready()
        .await
        .unwrap()
        .call(post("/c", Some("k"), "x"))
        .await
        .unwrap();
    assert!(
        res.into_body().collect().await.is_err(),
        "the client saw the failure"
    );
    tokio::task::yield_now().await;
    assert!(
        svc.store_ref().is_empty(),
        "released, not kept as not-replayable"
    );
    let res = svc
        .ready()
        .await
        .unwrap()
        .call(post("/c", Some("k"), "x"))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK, "the retry ran");
    assert_eq!(runs.load(SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn an_over_limit_response_that_ends_cleanly_is_kept_not_replayable() {
    let runs = Arc::new(AtomicUsize::new(0));
    let mut svc = layer()
        .response_limit(1024)
        .layer(streaming_handler(runs.clone(), false));
    let res = svc
        .ready()
        .await
        .unwrap()
        .call(post("/c", Some("k"), "x"))
        .await
        .unwrap();
    let body = res.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body.len(), 4 * 1024, "the first caller gets it all");
    tokio::task::yield_now().await;
    let res = svc
        .ready()
        .await
        .unwrap()
        .call(post("/c", Some("k"), "x"))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::CONFLICT);
    assert_eq!(runs.load(SeqCst), 1, "the handler never runs twice");
}

#[tokio::test(start_paused = true)]
async fn huge_lease_and_retention_do_not_panic() {
    let handler = Handler::default();
    let mut svc = layer()
        .lease(Duration::MAX)
        .retention(Duration::MAX)
        .layer(handler.clone());
    assert_eq!(
        send(&mut svc, post("/c", Some("k"), "x")).await.status,
        StatusCode::CREATED
    );
    assert!(send(&mut svc, post("/c", Some("k"), "x")).await.replayed());
    assert_eq!(handler.runs(), 1);
}

#[tokio::test(start_paused = true)]
async fn the_handler_sees_the_records_key_the_same_for_the_same_request() {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let s = seen.clone();
    let mut svc = IdempotencyLayer::new().layer(tower::service_fn(move |req: Req| {
        s.lock()
            .unwrap()
            .push(req.extensions().get::<StoreKey>().copied());
        async {
            Ok::<_, Infallible>(
                Response::builder()
                    .status(503)
                    .body(Full::new(Bytes::new()))
                    .unwrap(),
            )
        }
    }));
    // A 503 releases the key, so the retry runs again: it must see the same key (a job id
    // derived from it is the same), and another key another one.
    send(&mut svc, post("/charge", Some("k1"), "{}")).await;
    send(&mut svc, post("/charge", Some("k1"), "{}")).await;
    send(&mut svc, post("/charge", Some("k2"), "{}")).await;
    let seen: Vec<String> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|k| k.map(|k| k.to_string()).unwrap_or_default())
        .collect();
    assert_eq!(seen.len(), 3);
    assert!(!seen[0].is_empty());
    assert_eq!(seen[0], seen[1]);
    assert_ne!(seen[0], seen[2]);
}
