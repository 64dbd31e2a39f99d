//! `RedisStore` against real `redis-server` processes (`store::redis` docs: each operation is
//! one single-key Lua script, on one server or a Redis Cluster; a fresh request costs 2 round
//! trips, a replay, conflict or mismatch 1; while Redis is unreachable the layer answers `503`
//! without running handlers and recovers on its own): the store contract on one server and on a
//! three-master cluster, round trips counted from `INFO commandstats`, a lost script cache, and
//! failing closed while Redis is down.
#![cfg(all(feature = "redis", feature = "conformance"))]

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;
use tower::{Layer, Service, ServiceExt};
use tower_once_idempotency::store::conformance::{RealClock, Suite};
use tower_once_idempotency::store::redis::RedisStore;
use tower_once_idempotency::{IdempotencyLayer, RequestBody};
use tower_once_test_support::redis::{RedisCluster, RedisServer};

/// Leases short enough for a real clock, long enough for a loaded 2-core machine.
const LEASE: Duration = Duration::from_millis(400);

#[tokio::test]
async fn redis_store_keeps_the_contract() {
    // REDIS_URL points the suite at an existing server; keys are random and prefixed.
    let server;
    let url = match std::env::var("REDIS_URL") {
        Ok(url) => url,
        Err(_) => {
            server = RedisServer::start();
            server.url()
        }
    };
    let store = RedisStore::connect(&url)
        .await
        .unwrap()
        .key_prefix("conformance:");
    Suite::new(store, RealClock)
        .durations(LEASE, LEASE)
        .run()
        .await;
}

#[tokio::test]
async fn redis_cluster_keeps_the_contract_and_runs_duplicates_once() {
    let cluster = RedisCluster::start();
    let store = RedisStore::connect_cluster(cluster.urls()).await.unwrap();
    Suite::new(store.clone(), RealClock)
        .durations(LEASE, LEASE)
        .run()
        .await;

    let (handler, runs) = counting_handler(Duration::from_millis(100));
    let svc = IdempotencyLayer::with_store(store).layer(handler);
    let mut statuses = Vec::new();
    let tasks: Vec<_> = (0..200)
        .map(|i| {
            let svc = svc.clone();
            // Several keys, so the records land on different cluster nodes.
            tokio::spawn(async move { call(svc, &format!("key-{}", i % 4), "x").await.0 })
        })
        .collect();
    for task in tasks {
        statuses.push(task.await.unwrap());
    }
    assert!(statuses
        .iter()
        .all(|s| *s == StatusCode::CREATED || *s == StatusCode::CONFLICT));
    assert_eq!(runs.load(SeqCst), 4, "each of the 4 keys ran exactly once");
    let keys: usize = cluster
        .nodes
        .iter()
        .map(|n| n.cli(&["DBSIZE"]).trim().parse::<usize>().unwrap())
        .sum();
    assert!(keys >= 4, "the records are in the cluster");
}

#[tokio::test]
async fn round_trips_per_request_are_2_1_1_1() {
    let redis = RedisServer::start();
    let store = RedisStore::connect(&redis.url()).await.unwrap();
    let (handler, runs) = counting_handler(Duration::ZERO);
    let svc = IdempotencyLayer::with_store(store.clone()).layer(handler);
    // Warm up: the first use of each script loads it (NOSCRIPT, SCRIPT LOAD, EVALSHA).
    call(svc.clone(), "warm-up", "x").await;

    // commandstats also counts the commands a script runs, so each check names the complete
    // set: the EVALSHAs (the only commands the client sends, one per round trip) plus exactly
    // the commands those scripts run. Any extra round trip would show up as an extra entry.
    let measure = |redis: &RedisServer| {
        let mut calls: Vec<_> = redis
            .command_calls()
            .into_iter()
            .filter(|(cmd, _)| cmd != "info" && !cmd.starts_with("config"))
            .collect();
        calls.sort();
        calls
    };
    let expect = |pairs: &[(&str, u64)]| {
        let mut v: Vec<_> = pairs.iter().map(|(c, n)| (c.to_string(), *n)).collect();
        v.sort();
        v
    };
    redis.cli(&["CONFIG", "RESETSTAT"]);
    assert_eq!(call(svc.clone(), "k", "x").await.0, StatusCode::CREATED);
    assert_eq!(
        measure(&redis),
        expect(&[
            ("evalsha", 2),
            ("hmget", 2),
            ("hset", 2),
            ("pexpire", 2),
            ("hdel", 1)
        ]),
        "fresh: 2 round trips (claim, complete)"
    );

    redis.cli(&["CONFIG", "RESETSTAT"]);
    let (status, replayed) = call(svc.clone(), "k", "x").await;
    assert!(status == StatusCode::CREATED && replayed);
    assert_eq!(
        measure(&redis),
        expect(&[("evalsha", 1), ("hmget", 2)]),
        "replay: 1 round trip"
    );

    redis.cli(&["CONFIG", "RESETSTAT"]);
    assert_eq!(
        call(svc.clone(), "k", "other body").await.0,
        StatusCode::UNPROCESSABLE_ENTITY
    );
    assert_eq!(
        measure(&redis),
        expect(&[("evalsha", 1), ("hmget", 2)]),
        "mismatch: 1 round trip"
    );

    // Conflict: a slow request holds its key while a duplicate arrives.
    let (slow_handler, slow_runs) = counting_handler(Duration::from_secs(2));
    let slow = IdempotencyLayer::with_store(store).layer(slow_handler);
    let pending = tokio::spawn(call(slow.clone(), "slow", "x"));
    for _ in 0..400 {
        if slow_runs.load(SeqCst) == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(slow_runs.load(SeqCst), 1, "the slow request is running");
    redis.cli(&["CONFIG", "RESETSTAT"]);
    assert_eq!(
        call(slow.clone(), "slow", "x").await.0,
        StatusCode::CONFLICT
    );
    assert_eq!(
        measure(&redis),
        expect(&[("evalsha", 1), ("hmget", 1), ("pttl", 1)]),
        "conflict: 1 round trip"
    );
    assert_eq!(slow_runs.load(SeqCst), 1);
    assert_eq!(
        runs.load(SeqCst),
        2,
        "warm-up and k ran; the replay and mismatch did not"
    );
    pending.abort();
}

#[tokio::test]
async fn lost_script_cache_is_reloaded() {
    let redis = RedisServer::start();
    let store = RedisStore::connect(&redis.url()).await.unwrap();
    let (handler, runs) = counting_handler(Duration::ZERO);
    let svc = IdempotencyLayer::with_store(store).layer(handler);
    call(svc.clone(), "a", "x").await;
    redis.cli(&["SCRIPT", "FLUSH"]);
    assert_eq!(call(svc.clone(), "b", "x").await.0, StatusCode::CREATED);
    assert!(
        call(svc.clone(), "b", "x").await.1,
        "replayed after the reload"
    );
    assert_eq!(runs.load(SeqCst), 2);
}

#[tokio::test]
async fn redis_down_fails_closed_and_recovers_without_restart() {
    let mut redis = RedisServer::start();
    let store = RedisStore::connect_with_timeout(&redis.url(), Duration::from_millis(300))
        .await
        .unwrap();
    let (handler, runs) = counting_handler(Duration::ZERO);
    let svc = IdempotencyLayer::with_store(store).layer(handler);
    assert_eq!(
        call(svc.clone(), "before", "x").await.0,
        StatusCode::CREATED
    );

    redis.stop();
    for i in 0..5 {
        let (status, _) = call(svc.clone(), &format!("down-{i}"), "x").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    }
    assert_eq!(runs.load(SeqCst), 1, "no handler ran while Redis was down");

    redis.restart();
    let recovered = created_within_5s(svc.clone(), "after").await;
    assert!(recovered, "requests succeed again once Redis is back");
    assert_eq!(runs.load(SeqCst), 2);
    assert!(
        call(svc.clone(), "after", "x").await.1,
        "and the record is in the new Redis"
    );
}

#[tokio::test]
async fn a_frozen_redis_times_out_into_503_and_recovers() {
    let redis = RedisServer::start();
    let timeout = Duration::from_millis(300);
    let store = RedisStore::connect_with_timeout(&redis.url(), timeout)
        .await
        .unwrap();
    let (handler, runs) = counting_handler(Duration::ZERO);
    let svc = IdempotencyLayer::with_store(store).layer(handler);
    assert_eq!(
        call(svc.clone(), "before", "x").await.0,
        StatusCode::CREATED
    );

    redis.signal("-STOP");
    let started = std::time::Instant::now();
    let (status, _) = call(svc.clone(), "frozen", "x").await;
    let waited = started.elapsed();
    redis.signal("-CONT");
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        waited < Duration::from_secs(5),
        "bounded by the command timeout, not hung: {waited:?}"
    );
    assert_eq!(runs.load(SeqCst), 1, "no handler ran without a claim");

    // The frozen claim landed when Redis woke up; it was released in the background, so the
    // client's retry of the same key runs well within the 10 s lease it would otherwise hold.
    let started = std::time::Instant::now();
    let retried = created_within_5s(svc.clone(), "frozen").await;
    assert!(retried, "the retry ran instead of 409 for a whole lease");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(runs.load(SeqCst), 2);

    let recovered = created_within_5s(svc.clone(), "after").await;
    assert!(recovered);
    assert_eq!(runs.load(SeqCst), 3);
}

#[tokio::test]
async fn huge_durations_neither_panic_nor_leave_a_half_written_record() {
    let redis = RedisServer::start();
    let store = RedisStore::connect(&redis.url()).await.unwrap();
    let (handler, runs) = counting_handler(Duration::ZERO);
    let svc = IdempotencyLayer::with_store(store)
        .lease(Duration::MAX)
        .retention(Duration::MAX)
        .layer(handler);
    assert_eq!(
        call(svc.clone(), "k", "x").await,
        (StatusCode::CREATED, false)
    );
    assert_eq!(
        call(svc.clone(), "k", "x").await,
        (StatusCode::CREATED, true)
    );
    assert_eq!(runs.load(SeqCst), 1);
    let keys = redis.cli(&["--scan", "--pattern", "tower-once:*"]);
    let key = keys.lines().next().expect("one record");
    let ttl: i64 = redis.cli(&["PTTL", key]).trim().parse().unwrap();
    assert!(ttl > 0, "the record expires some day: {ttl}");
}

/// Retries a keyed call (bounded: 100 tries, 50 ms apart) until it answers 201.
async fn created_within_5s<S>(svc: S, key: &str) -> bool
where
    S: Service<
            Request<Full<Bytes>>,
            Response = Response<tower_once_idempotency::ResponseBody<Full<Bytes>>>,
            Error = Infallible,
        > + Clone,
{
    for _ in 0..100 {
        if call(svc.clone(), key, "x").await.0 == StatusCode::CREATED {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

type Handler = tower::util::BoxCloneSyncService<
    Request<RequestBody<Full<Bytes>>>,
    Response<Full<Bytes>>,
    Infallible,
>;

fn counting_handler(delay: Duration) -> (Handler, Arc<AtomicUsize>) {
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = runs.clone();
    let svc = tower::service_fn(move |_req: Request<RequestBody<Full<Bytes>>>| {
        counter.fetch_add(1, SeqCst);
        async move {
            tokio::time::sleep(delay).await;
            let mut res = Response::new(Full::new(Bytes::from_static(b"done")));
            *res.status_mut() = StatusCode::CREATED;
            Ok::<_, Infallible>(res)
        }
    });
    (tower::util::BoxCloneSyncService::new(svc), runs)
}

/// Sends one keyed POST; returns the status and whether it was a replay.
async fn call<S>(svc: S, key: &str, body: &'static str) -> (StatusCode, bool)
where
    S: Service<
        Request<Full<Bytes>>,
        Response = Response<tower_once_idempotency::ResponseBody<Full<Bytes>>>,
        Error = Infallible,
    >,
{
    let req = Request::post("/charges")
        .header("idempotency-key", key)
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .unwrap();
    let res = svc.oneshot(req).await.unwrap();
    let replayed = res.headers().contains_key("idempotent-replayed");
    let status = res.status();
    res.into_body().collect().await.unwrap();
    (status, replayed)
}

/// A claim in flight over the network (pending on the first poll) whose request is dropped at
/// any poll: the handler runs at most once, and the key is free long before its lease ends.
#[tokio::test]
async fn a_request_dropped_while_its_redis_claim_is_in_flight_frees_the_key_at_once() {
    let redis = RedisServer::start();
    let store = RedisStore::connect(&redis.url()).await.unwrap();
    let (handler, runs) = counting_handler(Duration::from_millis(300));
    let svc = IdempotencyLayer::with_store(store)
        .lease(Duration::from_secs(60))
        .cancel_on_disconnect(true)
        .layer(handler);
    for polls in 1..4 {
        let key = format!("dropped-{polls}");
        let req = Request::post("/charges")
            .header("idempotency-key", key.as_str())
            .body(Full::new(Bytes::from_static(b"x")))
            .unwrap();
        let mut pending = Box::pin(svc.clone().oneshot(req));
        for _ in 0..polls {
            let _ = futures_util::poll!(pending.as_mut());
            tokio::task::yield_now().await;
        }
        drop(pending);
        let before = runs.load(SeqCst);
        // Released within 5 s, where the lease is 60 s.
        assert!(
            created_within_5s(svc.clone(), &key).await,
            "dropped after {polls} polls: the key was left held"
        );
        assert_eq!(runs.load(SeqCst), before + 1, "dropped after {polls} polls");
    }
}

/// The lease is renewed over Redis while the handler runs, also once its client left.
#[tokio::test]
async fn a_detached_handler_keeps_its_redis_claim_by_renewing_it() {
    let redis = RedisServer::start();
    let store = RedisStore::connect(&redis.url()).await.unwrap();
    let (handler, runs) = counting_handler(LEASE * 5);
    let svc = IdempotencyLayer::with_store(store)
        .lease(LEASE)
        .layer(handler);
    let first = tokio::spawn(call(svc.clone(), "renewed", "x"));
    tokio::time::sleep(LEASE / 2).await;
    assert_eq!(runs.load(SeqCst), 1);
    first.abort(); // the client went away; the handler goes on on a task of its own
    tokio::time::sleep(LEASE * 2).await;
    let (status, _) = call(svc.clone(), "renewed", "x").await;
    assert_eq!(status, StatusCode::CONFLICT, "the lease was renewed");
    assert!(created_or_replayed_within_5s(svc.clone(), "renewed").await);
    assert_eq!(runs.load(SeqCst), 1, "the handler ran once");
}

/// Retries a keyed call until it is replayed.
async fn created_or_replayed_within_5s<S>(svc: S, key: &str) -> bool
where
    S: Service<
            Request<Full<Bytes>>,
            Response = Response<tower_once_idempotency::ResponseBody<Full<Bytes>>>,
            Error = Infallible,
        > + Clone,
{
    for _ in 0..100 {
        if call(svc.clone(), key, "x").await.1 {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}
