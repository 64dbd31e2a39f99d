//! The demo server on Redis as real processes (examples/README.md: several replicas share
//! the records through Redis; while Redis is unreachable the layer answers `503` and recovers on
//! its own when Redis returns): many replicas, a replica killed mid-request, and Redis itself going
//! away and coming back.
#![cfg(feature = "redis")]

mod support;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use std::sync::Arc;
use std::time::Duration;
use support::DemoServer;
use tower_once_test_support::redis::RedisServer;

const ORDER: &str = r#"{"order_id":"A","amount":500}"#;

struct Http(Client<HttpConnector, Full<Bytes>>);

struct Answer {
    status: StatusCode,
    replayed: bool,
    body: Bytes,
}

impl Http {
    fn new() -> Self {
        Self(Client::builder(TokioExecutor::new()).build_http())
    }

    async fn post(&self, url: String, key: &str) -> Answer {
        let req = Request::post(url)
            .header("idempotency-key", key)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from_static(ORDER.as_bytes())))
            .unwrap();
        let res = self.0.request(req).await.unwrap();
        let replayed = res.headers().contains_key("idempotent-replayed");
        let status = res.status();
        let body = res.into_body().collect().await.unwrap().to_bytes();
        Answer {
            status,
            replayed,
            body,
        }
    }

    async fn ledger(&self, server: &DemoServer) -> Vec<serde_json::Value> {
        let req = Request::get(format!("{}/charges", server.base()))
            .body(Full::default())
            .unwrap();
        let res = self.0.request(req).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        serde_json::from_slice(&res.into_body().collect().await.unwrap().to_bytes()).unwrap()
    }
}

#[tokio::test]
async fn two_replicas_run_a_burst_of_duplicates_once() {
    let redis = RedisServer::start();
    let a = DemoServer::start(&["--redis", &redis.url()]);
    let b = DemoServer::start(&["--redis", &redis.url()]);
    let http = Arc::new(Http::new());
    let tasks: Vec<_> = (0..200)
        .map(|i| {
            let http = http.clone();
            let base = if i % 2 == 0 { a.base() } else { b.base() };
            tokio::spawn(async move {
                http.post(format!("{base}/charges?delay_ms=100"), "burst")
                    .await
            })
        })
        .collect();
    let mut created = 0;
    for task in tasks {
        let answer = task.await.unwrap();
        match answer.status {
            StatusCode::CREATED => created += 1,
            StatusCode::CONFLICT => {}
            other => panic!("unexpected {other}: {:?}", answer.body),
        }
    }
    assert!(created >= 1);
    let (ledger_a, ledger_b) = (http.ledger(&a).await, http.ledger(&b).await);
    assert_eq!(
        ledger_a.len(),
        1,
        "the handler ran exactly once across both processes"
    );
    assert_eq!(ledger_a, ledger_b, "both processes read one ledger");
}

#[tokio::test]
async fn a_killed_replica_frees_its_key_after_one_lease() {
    let redis = RedisServer::start();
    let args = ["--redis", &redis.url(), "--lease-ms", "1000"];
    let mut doomed = DemoServer::start(&args);
    let survivor = DemoServer::start(&args);
    let http = Arc::new(Http::new());

    // The handler sleeps 2 s before charging: longer than the 1 s lease, which only renewals
    // keep alive.
    let path = "/charges?delay_ms=2000";
    let in_flight = {
        let http = http.clone();
        let url = format!("{}{path}", doomed.base());
        tokio::spawn(async move { http.0.request(post_request(url, "crash")).await })
    };
    let retry_url = format!("{}{path}", survivor.base());
    // Wait (bounded) for the claim to appear in Redis; an HTTP probe could claim it first.
    for _ in 0..400 {
        if !redis.cli(&["KEYS", "tower-once:idem:*"]).trim().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let held = http.post(retry_url.clone(), "crash").await;
    assert_eq!(
        held.status,
        StatusCode::CONFLICT,
        "the doomed process holds the key"
    );

    doomed.kill(); // SIGKILL mid-request: nothing is released, no renewal follows
    assert!(
        in_flight.await.unwrap().is_err(),
        "the client saw its connection die"
    );
    let right_after = http.post(retry_url.clone(), "crash").await;
    assert_eq!(
        right_after.status,
        StatusCode::CONFLICT,
        "within the lease the key stays held"
    );

    // Retry as a client would, on the surviving process, until the lease runs out.
    let mut retried = None;
    for _ in 0..100 {
        let answer = http.post(retry_url.clone(), "crash").await;
        if answer.status != StatusCode::CONFLICT {
            retried = Some(answer);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let retried = retried.expect("the key was freed within about one lease");
    assert_eq!(retried.status, StatusCode::CREATED);
    assert!(!retried.replayed, "the retry ran the handler");
    let charges = http.ledger(&survivor).await;
    assert_eq!(
        charges.len(),
        1,
        "the killed request never charged; the retry charged once"
    );
    assert!(http.post(retry_url, "crash").await.replayed);
}

fn post_request(url: String, key: &str) -> Request<Full<Bytes>> {
    Request::post(url)
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(ORDER.as_bytes())))
        .unwrap()
}

#[tokio::test]
async fn redis_outage_answers_503_and_recovers_without_a_server_restart() {
    let mut redis = RedisServer::start();
    let server = DemoServer::start(&["--redis", &redis.url()]);
    let http = Http::new();
    let url = format!("{}/charges", server.base());
    assert_eq!(
        http.post(url.clone(), "before").await.status,
        StatusCode::CREATED
    );

    redis.stop();
    for i in 0..3 {
        let answer = http.post(url.clone(), &format!("during-{i}")).await;
        assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE);
        let problem: serde_json::Value = serde_json::from_slice(&answer.body).unwrap();
        assert_eq!(
            problem["type"],
            "urn:tower-once:idempotency:store-unavailable"
        );
    }

    // Same port, empty (no persistence): what was stored before the outage is gone.
    redis.restart();
    let mut after = None;
    for _ in 0..100 {
        let answer = http.post(url.clone(), "after").await;
        if answer.status != StatusCode::SERVICE_UNAVAILABLE {
            after = Some(answer);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let after = after.expect("the server recovered without a restart");
    assert_eq!(after.status, StatusCode::CREATED);
    assert!(!after.replayed);
    let charges = http.ledger(&server).await;
    assert_eq!(
        charges.len(),
        1,
        "only the request after the outage charged (Redis kept nothing)"
    );
    assert!(
        http.post(url, "after").await.replayed,
        "the new record replays"
    );
}
