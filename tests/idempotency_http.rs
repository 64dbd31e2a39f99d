//! What the idempotency layer answers (idempotency crate docs "What happens to a request", "Try
//! it"), end to end: the demo charge router served by hyper on loopback, driven by a hyper-util
//! client, every answer counted in the ledger (the handler's effect).

#[allow(dead_code)]
#[path = "../examples/server/app.rs"]
mod app;

use app::{Charge, Ledger};
use axum::routing::post;
use axum::Router;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;
use tower_once::idempotency::store::MemoryStore;
use tower_once::idempotency::IdempotencyLayer;

struct Server {
    addr: SocketAddr,
    ledger: Ledger,
    client: Client<HttpConnector, Full<Bytes>>,
}

struct Answer {
    status: StatusCode,
    headers: http::HeaderMap,
    body: Bytes,
}

impl Answer {
    fn replayed(&self) -> bool {
        self.headers
            .get("idempotent-replayed")
            .is_some_and(|v| v == "true")
    }
    fn problem_type(&self) -> String {
        let v: serde_json::Value = serde_json::from_slice(&self.body).unwrap();
        v["type"].as_str().unwrap_or_default().to_owned()
    }
}

async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

async fn start() -> Server {
    let ledger = Ledger::memory();
    let app = app::router(MemoryStore::new(), Duration::from_secs(10), ledger.clone());
    Server {
        addr: serve(app).await,
        ledger,
        client: Client::builder(TokioExecutor::new()).build_http(),
    }
}

impl Server {
    async fn post(
        &self,
        path: &str,
        key: Option<&str>,
        tenant: Option<&str>,
        body: impl Into<Bytes>,
    ) -> Answer {
        let mut req = Request::post(format!("http://{}{path}", self.addr))
            .header("content-type", "application/json");
        if let Some(key) = key {
            req = req.header("idempotency-key", key);
        }
        if let Some(tenant) = tenant {
            req = req.header("x-tenant-id", tenant);
        }
        self.send(req.body(Full::new(body.into())).unwrap()).await
    }

    async fn send(&self, req: Request<Full<Bytes>>) -> Answer {
        let res: Response<_> = self.client.request(req).await.unwrap();
        let (parts, body) = res.into_parts();
        Answer {
            status: parts.status,
            headers: parts.headers,
            body: body.collect().await.unwrap().to_bytes(),
        }
    }

    async fn charges(&self) -> Vec<Charge> {
        self.ledger.charges().await.unwrap()
    }
}

const ORDER_A: &str = r#"{"order_id":"A","amount":500}"#;

#[tokio::test]
async fn first_request_charges_once_and_retries_replay_it_exactly() {
    let server = start().await;
    let first = server.post("/charges", Some("k-1"), None, ORDER_A).await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(!first.replayed());
    assert_eq!(server.charges().await.len(), 1);

    for _ in 0..3 {
        let again = server.post("/charges", Some("k-1"), None, ORDER_A).await;
        assert_eq!(again.status, first.status);
        assert_eq!(again.body, first.body, "byte-identical body");
        assert!(again.replayed());
        for (name, value) in &first.headers {
            if name != "date" {
                assert_eq!(again.headers.get(name), Some(value), "{name} replayed");
            }
        }
    }
    assert_eq!(
        server.charges().await.len(),
        1,
        "retries never charge again"
    );
}

#[tokio::test]
async fn two_hundred_concurrent_duplicates_charge_once() {
    let server = Arc::new(start().await);
    let tasks: Vec<_> = (0..200)
        .map(|_| {
            let server = server.clone();
            tokio::spawn(async move {
                server
                    .post("/charges?delay_ms=50", Some("burst"), None, ORDER_A)
                    .await
            })
        })
        .collect();
    let (mut created, mut conflicts) = (0, 0);
    for task in tasks {
        let answer = task.await.unwrap();
        match answer.status {
            StatusCode::CREATED => created += 1,
            StatusCode::CONFLICT => {
                assert_eq!(
                    answer.problem_type(),
                    "urn:tower-once:idempotency:in-progress"
                );
                assert!(answer.headers.contains_key("retry-after"));
                conflicts += 1;
            }
            other => panic!("unexpected status {other}"),
        }
    }
    assert_eq!(created + conflicts, 200);
    assert_eq!(
        server.charges().await.len(),
        1,
        "the handler ran exactly once"
    );
    let after = server
        .post("/charges?delay_ms=50", Some("burst"), None, ORDER_A)
        .await;
    assert!(after.replayed());
    assert_eq!(server.charges().await.len(), 1);
}

#[tokio::test]
async fn tenants_with_one_key_are_independent() {
    let server = start().await;
    let a = server
        .post("/charges", Some("same"), Some("acme"), ORDER_A)
        .await;
    let b = server
        .post("/charges", Some("same"), Some("globex"), ORDER_A)
        .await;
    assert_eq!(
        (a.status, b.status),
        (StatusCode::CREATED, StatusCode::CREATED)
    );
    assert!(!b.replayed(), "globex does not get acme's response");
    let tenants: Vec<_> = server
        .charges()
        .await
        .into_iter()
        .map(|c| c.tenant)
        .collect();
    assert_eq!(tenants, ["acme", "globex"]);
    assert_eq!(
        server
            .post("/charges", Some("same"), Some("acme"), ORDER_A)
            .await
            .body,
        a.body
    );
    assert_eq!(server.charges().await.len(), 2);
}

#[tokio::test]
async fn a_key_reused_with_another_body_is_422() {
    let server = start().await;
    server.post("/charges", Some("k"), None, ORDER_A).await;
    let other = server
        .post(
            "/charges",
            Some("k"),
            None,
            r#"{"order_id":"A","amount":999}"#,
        )
        .await;
    assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        other.problem_type(),
        "urn:tower-once:idempotency:fingerprint-mismatch"
    );
    assert_eq!(server.charges().await.len(), 1);
    assert_eq!(server.charges().await[0].amount, 500);
}

#[tokio::test]
async fn oversized_body_is_413_and_charges_nothing() {
    let server = start().await;
    let mut big = Vec::with_capacity(1024 * 1024 + 64);
    big.extend_from_slice(br#"{"order_id":"A","amount":5,"pad":""#);
    big.resize(1024 * 1024 + 1, b'x');
    let answer = server.post("/charges", Some("big"), None, big).await;
    assert_eq!(answer.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(
        answer.problem_type(),
        "urn:tower-once:idempotency:body-too-large"
    );
    assert!(server.charges().await.is_empty());
}

#[tokio::test]
async fn missing_and_invalid_keys_are_400_and_charge_nothing() {
    let server = start().await;
    let missing = server.post("/charges", None, None, ORDER_A).await;
    assert_eq!(missing.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        missing.problem_type(),
        "urn:tower-once:idempotency:missing-key"
    );
    let invalid = server
        .post("/charges", Some("has space"), None, ORDER_A)
        .await;
    assert_eq!(
        invalid.problem_type(),
        "urn:tower-once:idempotency:invalid-key"
    );
    assert!(server.charges().await.is_empty());
}

#[tokio::test]
async fn handler_400_is_not_stored_so_a_fixed_resend_runs() {
    let server = start().await;
    let bad = server
        .post(
            "/charges",
            Some("neg"),
            None,
            r#"{"order_id":"A","amount":-5}"#,
        )
        .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    let again = server
        .post(
            "/charges",
            Some("neg"),
            None,
            r#"{"order_id":"A","amount":-5}"#,
        )
        .await;
    assert!(!again.replayed(), "a validation rejection is not stored");
    assert_eq!(again.status, StatusCode::BAD_REQUEST);
    assert!(server.charges().await.is_empty());
    let fixed = server
        .post(
            "/charges",
            Some("neg"),
            None,
            r#"{"order_id":"A","amount":5}"#,
        )
        .await;
    assert_eq!(fixed.status, StatusCode::CREATED, "the fixed resend runs");
    assert_eq!(server.charges().await.len(), 1);
}

#[tokio::test]
async fn a_5xx_releases_the_key_so_the_retry_charges_once() {
    let server = start().await;
    let failed = server
        .post("/charges?fail=503", Some("flaky"), None, ORDER_A)
        .await;
    assert_eq!(failed.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(server.charges().await.is_empty());
    let retried = server.post("/charges", Some("flaky"), None, ORDER_A).await;
    assert_eq!(retried.status, StatusCode::CREATED);
    assert!(!retried.replayed(), "the retry ran");
    assert_eq!(server.charges().await.len(), 1);
}

#[tokio::test]
async fn a_client_that_disconnects_mid_handler_is_charged_once_and_its_retry_replayed() {
    let server = Arc::new(start().await);
    const SLOW: &str = "/charges?delay_ms=600";
    let slow = {
        let server = server.clone();
        tokio::spawn(async move { server.post(SLOW, Some("gone"), None, ORDER_A).await })
    };
    // Wait (bounded) until the slow request holds the key.
    let mut held = false;
    for _ in 0..200 {
        let dup = server.post(SLOW, Some("gone"), None, ORDER_A).await;
        if dup.status == StatusCode::CONFLICT {
            held = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(held, "the slow request claimed the key");
    slow.abort(); // drops the client's connection; hyper drops the request's future
    let _ = slow.await;

    let mut retried = None;
    for _ in 0..400 {
        let answer = server.post(SLOW, Some("gone"), None, ORDER_A).await;
        if answer.status != StatusCode::CONFLICT {
            retried = Some(answer);
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let retried = retried.expect("the abandoned handler finished");
    assert_eq!(retried.status, StatusCode::CREATED);
    assert!(
        retried.replayed(),
        "the retry got the abandoned request's answer"
    );
    assert_eq!(server.charges().await.len(), 1, "charged exactly once");
}

/// A handler whose body ends with trailers, announced in a `Trailer` header.
async fn with_trailers() -> Response<axum::body::Body> {
    let mut trailers = http::HeaderMap::new();
    trailers.insert("x-checksum", http::HeaderValue::from_static("abc123"));
    let frames = vec![
        Ok::<_, Infallible>(http_body::Frame::data(Bytes::from_static(b"payload"))),
        Ok(http_body::Frame::trailers(trailers)),
    ];
    let body = http_body_util::StreamBody::new(futures_util::stream::iter(frames));
    Response::builder()
        .status(StatusCode::CREATED)
        .header("trailer", "x-checksum")
        .body(axum::body::Body::new(body))
        .unwrap()
}

#[tokio::test]
async fn trailers_reach_http1_clients_first_time_and_on_replay() {
    let app = Router::new()
        .route("/t", axum::routing::post(with_trailers))
        .layer(IdempotencyLayer::new());
    let addr = serve(app).await;
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let mut seen = Vec::new();
    for _ in 0..2 {
        let req = Request::post(format!("http://{addr}/t"))
            .header("idempotency-key", "tr")
            .header("te", "trailers")
            .body(Full::new(Bytes::from_static(b"x")))
            .unwrap();
        let res = client.request(req).await.unwrap();
        assert_eq!(res.version(), http::Version::HTTP_11);
        let replayed = res.headers().contains_key("idempotent-replayed");
        let collected = res.into_body().collect().await.unwrap();
        let trailer = collected
            .trailers()
            .and_then(|t| t.get("x-checksum"))
            .map(|v| v.to_str().unwrap().to_owned());
        assert_eq!(collected.to_bytes(), "payload");
        seen.push((replayed, trailer));
    }
    assert_eq!(
        seen,
        [
            (false, Some("abc123".to_owned())),
            (true, Some("abc123".to_owned()))
        ]
    );
}

#[tokio::test]
async fn a_client_still_uploading_reads_its_413() {
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = runs.clone();
    let app = Router::new()
        .route(
            "/upload",
            axum::routing::post(move || {
                counter.fetch_add(1, SeqCst);
                async { StatusCode::CREATED }
            }),
        )
        .layer(IdempotencyLayer::new().body_limit(64 * 1024));
    let addr = serve(app).await;
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let big = Bytes::from(vec![b'x'; 1024 * 1024]);
    for n in 0..10 {
        let req = Request::post(format!("http://{addr}/upload"))
            .header("idempotency-key", format!("u{n}"))
            .body(Full::new(big.clone()))
            .unwrap();
        let res = client
            .request(req)
            .await
            .expect("the client reads the answer, not a reset");
        assert_eq!(res.status(), StatusCode::PAYLOAD_TOO_LARGE);
    }
    assert_eq!(runs.load(SeqCst), 0);
}

#[tokio::test]
async fn get_passes_through_untouched() {
    let server = start().await;
    server.post("/charges", Some("k"), None, ORDER_A).await;
    for _ in 0..2 {
        let get = Request::get(format!("http://{}/charges", server.addr))
            .header("idempotency-key", "k")
            .body(Full::default())
            .unwrap();
        let answer = server.send(get).await;
        assert_eq!(answer.status, StatusCode::OK);
        assert!(!answer.replayed());
        let listed: Vec<Charge> = serde_json::from_slice(&answer.body).unwrap();
        assert_eq!(listed, server.charges().await);
    }
}

#[tokio::test]
async fn route_layer_covers_only_its_routes() {
    let runs = Arc::new(AtomicUsize::new(0));
    let count = |runs: Arc<AtomicUsize>| {
        post(move || async move { (StatusCode::CREATED, runs.fetch_add(1, SeqCst).to_string()) })
    };
    let app = Router::new()
        .route("/covered", count(runs.clone()))
        .route_layer(IdempotencyLayer::new())
        .route("/open", count(runs.clone()));
    let addr = serve(app).await;
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    for path in ["/covered", "/covered", "/open", "/open"] {
        let req = Request::post(format!("http://{addr}{path}"))
            .header("idempotency-key", "k")
            .body(Full::default())
            .unwrap();
        assert_eq!(
            client.request(req).await.unwrap().status(),
            StatusCode::CREATED
        );
    }
    assert_eq!(runs.load(SeqCst), 3, "/covered ran once, /open twice");
}
