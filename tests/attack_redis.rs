//! Attacks on the Redis store's lost-claim release (guarantee 5) with real redis-server
//! processes (started by `tests/support`).
#![cfg(feature = "redis")]

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;
use tower::{Layer, Service, ServiceExt};
use tower_once::idempotency::store::redis::RedisStore;
use tower_once::idempotency::{IdempotencyLayer, RequestBody};
use tower_once_test_support::redis::RedisServer;

type Handler = tower::util::BoxCloneSyncService<
    Request<RequestBody<Full<Bytes>>>,
    Response<Full<Bytes>>,
    Infallible,
>;

fn counting_handler() -> (Handler, Arc<AtomicUsize>) {
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = runs.clone();
    let svc = tower::service_fn(move |_req: Request<RequestBody<Full<Bytes>>>| {
        counter.fetch_add(1, SeqCst);
        async move {
            let mut res = Response::new(Full::new(Bytes::from_static(b"done")));
            *res.status_mut() = StatusCode::CREATED;
            Ok::<_, Infallible>(res)
        }
    });
    (tower::util::BoxCloneSyncService::new(svc), runs)
}

async fn call<S>(svc: S, key: &str) -> (StatusCode, bool)
where
    S: Service<
        Request<Full<Bytes>>,
        Response = Response<tower_once::idempotency::ResponseBody<Full<Bytes>>>,
        Error = Infallible,
    >,
{
    let req = Request::post("/charges")
        .header("idempotency-key", key)
        .body(Full::new(Bytes::from_static(b"x")))
        .unwrap();
    let res = svc.oneshot(req).await.unwrap();
    let replayed = res.headers().contains_key("idempotent-replayed");
    let status = res.status();
    res.into_body().collect().await.unwrap();
    (status, replayed)
}

/// Was a break found by the attack, now fixed. The background release of a timed-out claim gives up after 4 tries
/// (`RELEASE_TRIES`/`RELEASE_PAUSE` in future/claim.rs, about 3 s with a 300 ms command
/// timeout). When Redis is frozen longer than that, the claim still lands when it wakes up but
/// nothing releases it any more, so the client's retry after the hiccup gets 409 for the whole
/// lease (10 s) instead of running "within about 1-2 s".
#[tokio::test]
async fn a_freeze_longer_than_the_release_schedule_frees_the_key_soon_after() {
    freeze_then_retry(false).await;
}

/// HOLDS (control for the diagnosis): the same 4 s freeze, after the process has released one
/// key before (so the release script is in Redis's script cache). The release commands queued
/// during the freeze then run after the claim when Redis wakes, and the retry runs at once.
/// The difference shows the cause: in the failing case the queued `EVALSHA release` answers
/// `NOSCRIPT`, and the load-and-retry that redis-rs does on `NOSCRIPT` is dropped with the
/// future that `tokio::time::timeout` already abandoned (store/redis.rs `run`).
#[tokio::test]
async fn the_same_freeze_with_the_release_script_cached() {
    freeze_then_retry(true).await;
}

async fn freeze_then_retry(warm_release: bool) {
    let redis = RedisServer::start();
    let store = RedisStore::connect_with_timeout(&redis.url(), Duration::from_millis(300))
        .await
        .unwrap();
    let (handler, runs) = counting_handler();
    let svc = IdempotencyLayer::with_store(store).layer(handler);
    assert_eq!(call(svc.clone(), "warm").await.0, StatusCode::CREATED);
    if warm_release {
        redis.cli(&[
            "SCRIPT",
            "LOAD",
            tower_once::idempotency::store::redis::RELEASE_SCRIPT,
        ]);
    }

    redis.signal("-STOP");
    let (status, _) = call(svc.clone(), "frozen").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    // The hiccup lasts 4 s (a failover, a long KEYS, a GC pause on a VM).
    tokio::time::sleep(Duration::from_secs(4)).await;
    redis.signal("-CONT");
    let thawed = std::time::Instant::now();

    // The client retries (bounded: 60 tries, 50 ms apart, about 3 s).
    let mut statuses = Vec::new();
    let mut created = false;
    for _ in 0..60 {
        let (status, _) = call(svc.clone(), "frozen").await;
        statuses.push(status.as_u16());
        if status == StatusCode::CREATED {
            created = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    statuses.dedup();
    let record = redis.cli(&["--scan", "--pattern", "tower-once:*"]);
    let calls = redis.command_calls();
    let clients = redis.cli(&["INFO", "clients"]);
    let connected = clients
        .lines()
        .find(|l| l.starts_with("connected_clients"))
        .map(str::to_owned);
    assert!(
        created,
        "no retry ran within ~3 s of Redis waking (answers: {statuses:?}; {:?} since thaw); \
         records in Redis: {record:?}; command calls: {calls:?}; {connected:?}",
        thawed.elapsed()
    );
    assert_eq!(runs.load(SeqCst), 2);
}

/// Was a break found by the attack, now fixed. The same `NOSCRIPT` hole on the completion path, where it costs a second run of the
/// handler. On a Redis whose script cache is empty (a fresh server, a restart or a failover to a
/// replica), the first request claims (the claim script is loaded inside that command's future),
/// its handler runs, and Redis stalls just as it finishes: `EVALSHA complete` times out (the
/// client still gets its 201). When Redis wakes, the queued `EVALSHA` answers `NOSCRIPT` and the
/// load-and-retry is gone with the abandoned future, so the response is never stored; the lease
/// lapses and the client's retry runs the handler again. Control: the same with the complete
/// script already cached stores the response (see the next test).
#[tokio::test]
async fn a_stall_at_completion_on_a_cold_script_cache_runs_the_handler_once() {
    assert_eq!(stall_at_completion(false).await, 1, "the handler ran twice");
}

/// HOLDS (control): the complete script is cached; the queued completion lands after the stall
/// and the retry is replayed.
#[tokio::test]
async fn a_stall_at_completion_with_the_script_cached_is_replayed() {
    assert_eq!(stall_at_completion(true).await, 1);
}

async fn stall_at_completion(cached: bool) -> usize {
    let redis = RedisServer::start();
    if cached {
        redis.cli(&[
            "SCRIPT",
            "LOAD",
            tower_once::idempotency::store::redis::COMPLETE_SCRIPT,
        ]);
    }
    let store = RedisStore::connect_with_timeout(&redis.url(), Duration::from_millis(300))
        .await
        .unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let (counter, gate2) = (runs.clone(), gate.clone());
    let handler = tower::service_fn(move |_req: Request<RequestBody<Full<Bytes>>>| {
        let (counter, gate) = (counter.clone(), gate2.clone());
        async move {
            if counter.fetch_add(1, SeqCst) == 0 {
                gate.acquire().await.unwrap().forget();
            }
            let mut res = Response::new(Full::new(Bytes::from_static(b"charged")));
            *res.status_mut() = StatusCode::CREATED;
            Ok::<_, Infallible>(res)
        }
    });
    let svc = IdempotencyLayer::with_store(store)
        .lease(Duration::from_secs(3))
        .layer(handler);
    let first = tokio::spawn(call(svc.clone(), "pay"));
    for _ in 0..200 {
        if runs.load(SeqCst) == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(runs.load(SeqCst), 1, "the first handler is running");
    redis.signal("-STOP");
    gate.add_permits(1);
    let (status, _) = first.await.unwrap();
    assert_eq!(status, StatusCode::CREATED, "the client got its charge");
    tokio::time::sleep(Duration::from_millis(700)).await;
    redis.signal("-CONT");
    // The client retries (bounded: 80 tries, 100 ms apart) until it is not told "in progress".
    for _ in 0..80 {
        let (status, replayed) = call(svc.clone(), "pay").await;
        if status != StatusCode::CONFLICT {
            assert_eq!(status, StatusCode::CREATED);
            eprintln!("retry answered {status}, replayed: {replayed}");
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    runs.load(SeqCst)
}

/// Was a break found by the attack, now fixed. A connection reset (Redis `CLIENT KILL`, a proxy or failover dropping connections)
/// just as the handler finishes: the single `complete` command fails on the dead connection and
/// is never retried (`ClaimGuard::complete` / `poll_finish`, future/claim.rs: one attempt; the
/// release path gets four). The response is not stored, the record stays in progress until its
/// lease ends, and the client's retry then runs the handler a second time.
#[tokio::test]
async fn a_connection_reset_at_completion_runs_the_handler_once() {
    let redis = RedisServer::start();
    let store = RedisStore::connect_with_timeout(&redis.url(), Duration::from_millis(500))
        .await
        .unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let (counter, gate2) = (runs.clone(), gate.clone());
    let handler = tower::service_fn(move |req: Request<RequestBody<Full<Bytes>>>| {
        let (counter, gate) = (counter.clone(), gate2.clone());
        let pay = req.headers()["idempotency-key"] == "pay";
        async move {
            if counter.fetch_add(1, SeqCst) == 0 && pay {
                gate.acquire().await.unwrap().forget();
            }
            let mut res = Response::new(Full::new(Bytes::from_static(b"charged")));
            *res.status_mut() = StatusCode::CREATED;
            Ok::<_, Infallible>(res)
        }
    });
    let svc = IdempotencyLayer::with_store(store)
        .lease(Duration::from_secs(2))
        .layer(handler);
    // Warm every script so NOSCRIPT plays no part here.
    let warm = Request::post("/charges")
        .header("idempotency-key", "warm")
        .body(Full::new(Bytes::from_static(b"x")))
        .unwrap();
    runs.store(1, SeqCst); // the warm-up does not block
    let res = svc.clone().oneshot(warm).await.unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    // ...and a 503-less release: a key whose handler fails warms the release script.
    redis.cli(&[
        "SCRIPT",
        "LOAD",
        tower_once::idempotency::store::redis::RELEASE_SCRIPT,
    ]);
    redis.cli(&[
        "SCRIPT",
        "LOAD",
        tower_once::idempotency::store::redis::EXTEND_SCRIPT,
    ]);
    runs.store(0, SeqCst);
    let first = tokio::spawn(call(svc.clone(), "pay"));
    for _ in 0..200 {
        if runs.load(SeqCst) == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(runs.load(SeqCst), 1, "the first handler is running");
    eprintln!("killing");
    let killed = redis.cli(&["CLIENT", "KILL", "TYPE", "normal"]);
    eprintln!("killed: {killed:?}");
    gate.add_permits(1);
    let (status, _) = tokio::time::timeout(Duration::from_secs(10), first)
        .await
        .expect("the first request answered")
        .unwrap();
    eprintln!("first answered {status}");
    assert_eq!(status, StatusCode::CREATED, "the client got its charge");
    let mut answers = Vec::new();
    for _ in 0..60 {
        let (status, replayed) = call(svc.clone(), "pay").await;
        answers.push((status.as_u16(), replayed));
        if status != StatusCode::CONFLICT {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    answers.dedup();
    assert_eq!(
        runs.load(SeqCst),
        1,
        "the handler ran twice; retry answers: {answers:?}"
    );
}
