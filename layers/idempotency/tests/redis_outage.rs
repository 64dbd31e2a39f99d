//! `RedisStore` through Redis hiccups (`store::redis` docs: every command has a 1 s timeout,
//! the layer answers `503` while Redis is unreachable and recovers on its own; crate docs "What
//! happens to a request": a handler runs once per key): a Redis frozen longer than the
//! background release's schedule, a stall or a connection reset just as a handler finishes, on a
//! cold or a warm script cache. Real `redis-server` processes (SIGSTOP, `CLIENT KILL`); every test
//! counts handler runs.
#![cfg(feature = "redis")]

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;
use tower::{Layer, Service, ServiceExt};
use tower_once_idempotency::store::redis::RedisStore;
use tower_once_idempotency::{IdempotencyLayer, RequestBody};
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

/// A handler whose first run waits for a permit of the gate (so a test can act while it runs);
/// later runs answer at once. Counts its runs.
fn first_run_waits() -> (Handler, Arc<AtomicUsize>, Arc<tokio::sync::Semaphore>) {
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
    (tower::util::BoxCloneSyncService::new(handler), runs, gate)
}

/// Waits (bounded) until the first run has started.
async fn until_running(runs: &AtomicUsize) {
    for _ in 0..200 {
        if runs.load(SeqCst) == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn call<S>(svc: S, key: &str) -> (StatusCode, bool)
where
    S: Service<
        Request<Full<Bytes>>,
        Response = Response<tower_once_idempotency::ResponseBody<Full<Bytes>>>,
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

/// A claim that timed out during a Redis freeze longer than the background release's schedule
/// (`RELEASE_TRIES`/`RELEASE_PAUSE` in future/claim.rs, about 3 s with a 300 ms command timeout) is
/// still released soon after Redis wakes: the client's retry after the hiccup runs within about two
/// seconds. Was broken: the claim landed when Redis woke but nothing released it any more, so the
/// retry got 409 for the whole lease (10 s).
#[tokio::test]
async fn a_freeze_longer_than_the_release_schedule_frees_the_key_soon_after() {
    freeze_then_retry(false).await;
}

/// The same 4 s freeze, after the process has released one key before (so the release script is in
/// Redis's script cache): the release commands queued during the freeze run after the claim when
/// Redis wakes, and the retry runs at once. This one held before the fix too, which showed the
/// cause: on a cold cache the queued `EVALSHA release` answered `NOSCRIPT`, and the load-and-retry
/// that redis-rs does on `NOSCRIPT` was dropped with the future that `tokio::time::timeout` had
/// already abandoned (store/redis.rs `run`).
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
            tower_once_idempotency::store::redis::RELEASE_SCRIPT,
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

/// A Redis stall just as a handler finishes, on a Redis whose script cache is empty (a fresh
/// server, a restart or a failover to a replica): `EVALSHA complete` times out (the client still
/// gets its 201), and the handler still runs once: the client's retry after the stall never runs it
/// again. Was broken: when Redis woke, the queued `EVALSHA` answered `NOSCRIPT` and the
/// load-and-retry was gone with the abandoned future, so the response was never stored, the lease
/// lapsed and the retry ran the handler again. The control, with the script cached, is the next
/// test.
#[tokio::test]
async fn a_stall_at_completion_on_a_cold_script_cache_runs_the_handler_once() {
    assert_eq!(stall_at_completion(false).await, 1, "the handler ran twice");
}

/// The complete script is cached; the queued completion lands after the stall
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
            tower_once_idempotency::store::redis::COMPLETE_SCRIPT,
        ]);
    }
    let store = RedisStore::connect_with_timeout(&redis.url(), Duration::from_millis(300))
        .await
        .unwrap();
    let (handler, runs, gate) = first_run_waits();
    let svc = IdempotencyLayer::with_store(store)
        .lease(Duration::from_secs(3))
        .layer(handler);
    let first = tokio::spawn(call(svc.clone(), "pay"));
    until_running(&runs).await;
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

/// A connection reset (Redis `CLIENT KILL`, a proxy or failover dropping connections) just as the
/// handler finishes: the handler runs once, and the client's retry never runs it again. Was broken:
/// the single `complete` command failed on the dead connection and was never retried (the release
/// path got four tries), so the record stayed in progress until its lease ended and the retry then
/// ran the handler a second time.
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
        tower_once_idempotency::store::redis::RELEASE_SCRIPT,
    ]);
    redis.cli(&[
        "SCRIPT",
        "LOAD",
        tower_once_idempotency::store::redis::EXTEND_SCRIPT,
    ]);
    runs.store(0, SeqCst);
    let first = tokio::spawn(call(svc.clone(), "pay"));
    until_running(&runs).await;
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

/// Graceful shutdown waits for every background write, the store's own included: a completion
/// that timed out while Redis stalled is sent again by the store on a task of its own, and
/// `layer.detached().wait()` must wait for it, or a deploy cuts it off and the client's retry
/// after the restart runs the handler again. Was broken: the store spawned its retry on a bare
/// task that `detached()` did not count (it reported 0 running and returned at once).
#[tokio::test]
async fn shutdown_waits_for_a_completion_the_store_sends_again() {
    let redis = RedisServer::start();
    redis.cli(&[
        "SCRIPT",
        "LOAD",
        tower_once_idempotency::store::redis::COMPLETE_SCRIPT,
    ]);
    let store = RedisStore::connect_with_timeout(&redis.url(), Duration::from_millis(300))
        .await
        .unwrap();
    let (handler, runs, gate) = first_run_waits();
    let layer = IdempotencyLayer::with_store(store).lease(Duration::from_secs(30));
    let detached = layer.detached();
    let svc = layer.layer(handler);
    let first = tokio::spawn(call(svc.clone(), "pay"));
    until_running(&runs).await;
    assert_eq!(runs.load(SeqCst), 1, "the handler is running");
    // Redis stalls as the handler finishes: the completion times out (300 ms).
    redis.signal("-STOP");
    gate.add_permits(1);
    let (status, _) = first.await.unwrap();
    assert_eq!(status, StatusCode::CREATED, "the client got its charge");
    assert!(
        detached.running() >= 1,
        "the store's second try of the completion is counted"
    );
    redis.signal("-CONT");
    tokio::time::timeout(Duration::from_secs(15), detached.wait())
        .await
        .expect("the second try lands once Redis is back");
    assert_eq!(detached.running(), 0);
    let (status, replayed) = call(svc, "pay").await;
    assert_eq!(
        (status, replayed),
        (StatusCode::CREATED, true),
        "replayed, not run again"
    );
    assert_eq!(runs.load(SeqCst), 1);
}
