//! Attacks on `PostgresStore::transactional()`: each test states the guarantee it checks.
//! Tests that fail show a break; the report (attack branch) says which pass.
#![cfg(feature = "postgres")]

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;
use tower_once_idempotency::store::postgres::{sqlx, PostgresStore};
use tower_once_idempotency::{Claim, ClaimError, IdempotencyLayer};

mod support;

use support::{charge_through, ChargesDb};

async fn insert_charge(schema: &str, conn: &mut sqlx::PgConnection) -> Result<(), ClaimError> {
    sqlx::query(&format!("INSERT INTO {schema}.charges (amount) VALUES (5)"))
        .execute(conn)
        .await?;
    Ok(())
}

/// Takes every connection the pool has (up to `max_connections`, at once) and checks that
/// none is inside a transaction (an open one: `now()` is the transaction's start, or an
/// aborted one: the statement fails) and that none holds an advisory lock.
async fn assert_pool_clean(pool: &sqlx::PgPool) {
    let max = pool.options().get_max_connections() as usize;
    let mut conns = Vec::new();
    for _ in 0..max {
        match tokio::time::timeout(Duration::from_secs(2), pool.acquire()).await {
            Ok(Ok(conn)) => conns.push(conn),
            other => panic!("the pool could not hand out all its connections: {other:?}"),
        }
    }
    for conn in &mut conns {
        // Outside a transaction a savepoint is refused (25P01); inside an open one it is
        // taken, inside an aborted one refused with 25P02.
        let probe = sqlx::raw_sql("SAVEPOINT pool_probe")
            .execute(&mut **conn)
            .await;
        let code = probe
            .as_ref()
            .err()
            .and_then(|e| e.as_database_error())
            .and_then(|e| e.code())
            .map(|c| c.into_owned());
        assert_eq!(
            code.as_deref(),
            Some("25P01"),
            "a pooled connection is inside a transaction: {probe:?}"
        );
        let locks: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'advisory'",
        )
        .fetch_one(&mut **conn)
        .await
        .unwrap();
        assert_eq!(locks, 0, "a pooled connection holds an advisory lock");
    }
}

// ---------------------------------------------------------------------------------------------
// The store's conformance suite against a transactional store (real clock, 1 s lease).
// ---------------------------------------------------------------------------------------------

mod conformance {
    use super::*;
    use tower_once_idempotency::store::conformance::{RealClock, Suite};

    async fn suite() -> (ChargesDb, Suite<PostgresStore, RealClock>) {
        let db = ChargesDb::new().await;
        let store = db.store.clone().transactional();
        let suite = Suite::new(store, RealClock)
            .durations(Duration::from_millis(1000), Duration::from_millis(2000))
            .concurrency(16);
        (db, suite)
    }

    #[tokio::test]
    #[ignore = "known limit (store::postgres docs): a transactional claim in flight keeps no row, so a duplicate sees its own fingerprint (409 whatever its body)"]
    async fn rule1_claim_is_exclusive() {
        let (_db, s) = suite().await;
        s.claim_is_exclusive().await;
    }
    #[tokio::test]
    async fn rule1_concurrent_claims_have_one_winner() {
        let (_db, s) = suite().await;
        s.concurrent_claims_have_one_winner().await;
    }
    #[tokio::test]
    async fn rule3_complete_round_trips_the_response() {
        let (_db, s) = suite().await;
        s.complete_round_trips_the_response().await;
    }
    #[tokio::test]
    async fn rule3_not_replayable_is_kept() {
        let (_db, s) = suite().await;
        s.not_replayable_is_kept().await;
    }
    #[tokio::test]
    async fn rule2_writes_are_fenced_by_token() {
        let (_db, s) = suite().await;
        s.writes_are_fenced_by_token().await;
    }
    #[tokio::test]
    async fn rule2_completed_records_cannot_be_released_or_extended() {
        let (_db, s) = suite().await;
        s.completed_records_cannot_be_released_or_extended().await;
    }
    #[tokio::test]
    async fn release_frees_the_key() {
        let (_db, s) = suite().await;
        s.release_frees_the_key().await;
    }
    #[tokio::test]
    async fn rule4_extend_renews_the_lease() {
        let (_db, s) = suite().await;
        s.extend_renews_the_lease().await;
    }
    #[tokio::test]
    async fn rule4_lease_expiry_frees_the_key_and_fences_the_old_owner() {
        let (_db, s) = suite().await;
        s.lease_expiry_frees_the_key_and_fences_the_old_owner()
            .await;
    }
    #[tokio::test]
    async fn rule4_retention_expiry_frees_the_key() {
        let (_db, s) = suite().await;
        s.retention_expiry_frees_the_key().await;
    }
    #[tokio::test]
    async fn keys_are_independent() {
        let (_db, s) = suite().await;
        s.keys_are_independent().await;
    }
}

// ---------------------------------------------------------------------------------------------
// The lease: the layer renews it while the handler runs, the transactional store does not.
// ---------------------------------------------------------------------------------------------

/// A handler that never takes the transaction (its effect is elsewhere, e.g. another
/// service) and runs 1.5 leases. The layer renews the claim's lease every third of it, as it
/// does for every store; the duplicate sent after one lease must get 409 and never run.
#[tokio::test]
async fn a_live_untaken_claim_slower_than_the_lease_is_not_taken_by_a_duplicate() {
    let db = ChargesDb::new().await;
    let runs = Arc::new(AtomicUsize::new(0));
    let layer = IdempotencyLayer::with_store(db.store.clone().transactional())
        .lease(Duration::from_millis(600));
    let router = Router::new().route(
        "/charges",
        post({
            let runs = Arc::clone(&runs);
            move |_claim: Claim<PostgresStore>| async move {
                let run = runs.fetch_add(1, SeqCst) + 1;
                tokio::time::sleep(Duration::from_millis(900)).await;
                (StatusCode::CREATED, format!("charge {run}"))
            }
        })
        .layer(layer),
    );
    let first = tokio::spawn({
        let router = router.clone();
        async move { charge_through(&router, "k", "{}").await }
    });
    tokio::time::sleep(Duration::from_millis(750)).await;
    let during = charge_through(&router, "k", "{}").await;
    let first = first.await.unwrap();
    let after = charge_through(&router, "k", "{}").await;
    assert_eq!(first, (StatusCode::CREATED, false, "charge 1".into()));
    assert_eq!(
        during.0,
        StatusCode::CONFLICT,
        "the duplicate ran: {during:?}"
    );
    assert_eq!(after, (StatusCode::CREATED, true, "charge 1".into()));
    assert_eq!(runs.load(SeqCst), 1);
}

/// A response over the layer's response limit, read slowly by its client: the layer keeps
/// the claim (renewing it) until the body ended, then records "not replayable", so the key
/// never runs again.
#[tokio::test]
async fn an_untaken_claim_streaming_a_big_body_slowly_is_recorded_not_replayable() {
    use http_body_util::BodyExt;
    use tower::ServiceExt;
    let db = ChargesDb::new().await;
    let runs = Arc::new(AtomicUsize::new(0));
    let layer = IdempotencyLayer::with_store(db.store.clone().transactional())
        .lease(Duration::from_millis(600))
        .response_limit(1024);
    let router = Router::new().route(
        "/charges",
        post({
            let runs = Arc::clone(&runs);
            move |_claim: Claim<PostgresStore>| async move {
                runs.fetch_add(1, SeqCst);
                (StatusCode::CREATED, "x".repeat(8 * 1024))
            }
        })
        .layer(layer),
    );
    let response = router
        .clone()
        .oneshot(support::post("/charges", Some("k"), "{}"))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    // The client is slow: 1.5 leases before it reads the body.
    tokio::time::sleep(Duration::from_millis(900)).await;
    let during = charge_through(&router, "k", "{}").await;
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body.len(), 8 * 1024);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let after = charge_through(&router, "k", "{}").await;
    let runs = runs.load(SeqCst);
    eprintln!("during {} after {} runs {runs}", during.0, after.0);
    assert_eq!(
        during.0,
        StatusCode::CONFLICT,
        "the duplicate while streaming"
    );
    assert_ne!(
        after.0,
        StatusCode::CREATED,
        "ran again after the body ended"
    );
    assert_eq!(runs, 1);
}

/// Same with a handler that takes the transaction: its effect is in the transaction, it
/// calls a slow service (1.5 leases) before committing. Documented: an owner idle past the
/// lease is ended by Postgres. Checked here: never two committed effects, and no leaked lock.
#[tokio::test]
async fn a_taken_claim_idle_past_the_lease_never_commits_a_second_effect() {
    let db = ChargesDb::new().await;
    let runs = Arc::new(AtomicUsize::new(0));
    let schema = db.schema.name.clone();
    let layer = IdempotencyLayer::with_store(db.store.clone().transactional())
        .lease(Duration::from_millis(600));
    let router = Router::new().route(
        "/charges",
        post({
            let runs = Arc::clone(&runs);
            move |claim: Claim<PostgresStore>| async move {
                let run = runs.fetch_add(1, SeqCst) + 1;
                let res: Result<Response, ClaimError> = async {
                    let mut tx = claim.transaction().await?;
                    insert_charge(&schema, &mut tx).await?;
                    if run == 1 {
                        tokio::time::sleep(Duration::from_millis(900)).await;
                    }
                    claim
                        .commit(tx, (StatusCode::CREATED, format!("charge {run}")))
                        .await
                }
                .await;
                res.unwrap_or_else(IntoResponse::into_response)
            }
        })
        .layer(layer),
    );
    let first = tokio::spawn({
        let router = router.clone();
        async move { charge_through(&router, "k", "{}").await }
    });
    tokio::time::sleep(Duration::from_millis(750)).await;
    let during = charge_through(&router, "k", "{}").await;
    let first = first.await.unwrap();
    eprintln!("first {first:?} during {during:?}");
    assert_eq!(db.charges().await, 1);
    assert!(
        first.0 == StatusCode::CREATED || during.0 == StatusCode::CREATED,
        "{first:?} {during:?}"
    );
    assert_pool_clean(db.pool()).await;
}

// ---------------------------------------------------------------------------------------------
// Dropped requests, failures and the immediate retry.
// ---------------------------------------------------------------------------------------------

/// A router whose handler takes the claim's transaction, charges, runs `slow_sql` on it when
/// the run is the first, and commits 201 `charge N`.
fn slow_first_router(
    db: &ChargesDb,
    store: PostgresStore,
    layer: impl FnOnce(IdempotencyLayer<PostgresStore>) -> IdempotencyLayer<PostgresStore>,
    slow_sql: &'static str,
) -> (Arc<AtomicUsize>, Router) {
    let runs = Arc::new(AtomicUsize::new(0));
    let schema = db.schema.name.clone();
    let router = Router::new().route(
        "/charges",
        post({
            let runs = Arc::clone(&runs);
            move |claim: Claim<PostgresStore>| async move {
                let run = runs.fetch_add(1, SeqCst) + 1;
                let res: Result<Response, ClaimError> = async {
                    let mut tx = claim.transaction().await?;
                    insert_charge(&schema, &mut tx).await?;
                    if run == 1 {
                        sqlx::query(slow_sql).execute(&mut *tx).await?;
                    }
                    claim
                        .commit(tx, (StatusCode::CREATED, format!("charge {run}")))
                        .await
                }
                .await;
                res.unwrap_or_else(IntoResponse::into_response)
            }
        })
        .layer(layer(IdempotencyLayer::with_store(store.transactional()))),
    );
    (runs, router)
}

/// With `cancel_on_disconnect`, a client that leaves while its handler waits on a statement
/// cancels the handler: the transaction is dropped, so the key must be free at once.
#[tokio::test]
async fn a_request_cancelled_mid_statement_frees_the_key_at_once() {
    use tower::ServiceExt;
    let db = ChargesDb::new().await;
    let (runs, router) = slow_first_router(
        &db,
        db.store.clone(),
        |l| l.cancel_on_disconnect(true),
        "SELECT pg_sleep(3)",
    );
    let req = support::post("/charges", Some("k"), "{}");
    let left = tokio::time::timeout(Duration::from_millis(300), router.clone().oneshot(req)).await;
    assert!(left.is_err(), "the client left before the answer");
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = std::time::Instant::now();
    let retry = charge_through(&router, "k", "{}").await;
    eprintln!("retry {} after {:?}", retry.0, started.elapsed());
    if retry.0 == StatusCode::CONFLICT {
        // How long the key stays taken (bounded: 5 s).
        for _ in 0..20 {
            tokio::time::sleep(Duration::from_millis(250)).await;
            let again = charge_through(&router, "k", "{}").await;
            if again.0 != StatusCode::CONFLICT {
                eprintln!("free after {:?}: {}", started.elapsed(), again.0);
                break;
            }
        }
    }
    assert_eq!(retry, (StatusCode::CREATED, false, "charge 2".into()));
    assert_eq!((runs.load(SeqCst), db.charges().await), (2, 1));
    assert_pool_clean(db.pool()).await;
}

/// A `tower::timeout` around the layer cuts the client's wait, not the handler: the layer
/// finishes the handler on a task of its own (its default), so the retry meanwhile is told the
/// key is in progress, and afterwards replays the one charge.
#[tokio::test]
async fn a_timeout_around_the_layer_lets_the_handler_finish_and_the_retry_replays() {
    let db = ChargesDb::new().await;
    let (runs, router) = slow_first_router(&db, db.store.clone(), |l| l, "SELECT pg_sleep(1)");
    let router = router.layer(
        tower::ServiceBuilder::new()
            .layer(axum::error_handling::HandleErrorLayer::new(
                |_: tower::BoxError| async { StatusCode::GATEWAY_TIMEOUT },
            ))
            .layer(tower::timeout::TimeoutLayer::new(Duration::from_millis(
                300,
            ))),
    );
    let first = charge_through(&router, "k", "{}").await;
    assert_eq!(first.0, StatusCode::GATEWAY_TIMEOUT);
    let during = charge_through(&router, "k", "{}").await;
    assert_eq!(during.0, StatusCode::CONFLICT, "{during:?}");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let after = charge_through(&router, "k", "{}").await;
    assert_eq!(after, (StatusCode::CREATED, true, "charge 1".into()));
    assert_eq!((runs.load(SeqCst), db.charges().await), (1, 1));
}

/// A failure (503 after a rolled-back charge) and the client's immediate retry, 200 keys on a
/// multi-threaded runtime: every retry must run at once (never 409: the key is free at once).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_immediate_retry_after_a_rollback_never_gets_409() {
    let db = ChargesDb::new().await;
    let schema = db.schema.name.clone();
    let runs = Arc::new(AtomicUsize::new(0));
    let router = Router::new().route(
        "/charges",
        post({
            let runs = Arc::clone(&runs);
            move |claim: Claim<PostgresStore>, body: String| async move {
                runs.fetch_add(1, SeqCst);
                let res: Result<Response, ClaimError> = async {
                    let mut tx = claim.transaction().await?;
                    insert_charge(&schema, &mut tx).await?;
                    if body == "fail" {
                        return Ok((StatusCode::SERVICE_UNAVAILABLE, "rolled back").into_response());
                    }
                    claim.commit(tx, (StatusCode::CREATED, "charged")).await
                }
                .await;
                res.unwrap_or_else(IntoResponse::into_response)
            }
        })
        .layer(IdempotencyLayer::with_store(
            db.store.clone().transactional(),
        )),
    );
    let tasks: Vec<_> = (0..200)
        .map(|i| {
            let router = router.clone();
            tokio::spawn(async move {
                let key = format!("k{i}");
                let failed = charge_through(&router, &key, "fail").await;
                assert_eq!(failed.0, StatusCode::SERVICE_UNAVAILABLE);
                charge_through(&router, &key, "ok").await.0
            })
        })
        .collect();
    let mut conflicts = 0;
    for t in tasks {
        if t.await.unwrap() == StatusCode::CONFLICT {
            conflicts += 1;
        }
    }
    eprintln!(
        "conflicts {conflicts} of 200, charges {}",
        db.charges().await
    );
    assert_eq!(conflicts, 0, "retries answered 409 after a rollback");
    assert_pool_clean(db.pool()).await;
}

// ---------------------------------------------------------------------------------------------
// Configuration: pools, table names, timeouts, isolation.
// ---------------------------------------------------------------------------------------------

/// A pool of `max` connections to the test database, with these session settings.
async fn pool_with(max: u32, settings: &[(&str, &str)]) -> sqlx::PgPool {
    let options: sqlx::postgres::PgConnectOptions =
        tower_once_test_support::postgres::database_url()
            .parse()
            .unwrap();
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(max)
        .connect_with(options.options(settings.iter().copied()))
        .await
        .unwrap()
}

/// A router whose handler charges in the claim's transaction; a body `hold` says so on
/// `entered` and waits for `gate` before committing.
fn gated_router(
    db: &ChargesDb,
    store: PostgresStore,
    runs: Arc<AtomicUsize>,
    entered: Arc<tokio::sync::Notify>,
    gate: Arc<tokio::sync::Notify>,
) -> Router {
    let schema = db.schema.name.clone();
    Router::new().route(
        "/charges",
        post(
            move |claim: Claim<PostgresStore>, body: String| async move {
                let run = runs.fetch_add(1, SeqCst) + 1;
                let res: Result<Response, ClaimError> = async {
                    let mut tx = claim.transaction().await?;
                    insert_charge(&schema, &mut tx).await?;
                    if body == "hold" {
                        entered.notify_one();
                        gate.notified().await;
                    }
                    claim
                        .commit(tx, (StatusCode::CREATED, format!("charge {run}")))
                        .await
                }
                .await;
                res.unwrap_or_else(IntoResponse::into_response)
            },
        )
        .layer(IdempotencyLayer::with_store(store.transactional())),
    )
}

/// Two deployments name the same table differently (`schema.idem`, and `idem` on a pool whose
/// `search_path` is the schema). A duplicate through the second while the first runs must get
/// 409 and never run.
#[tokio::test]
async fn one_table_named_two_ways_still_locks_the_key_once() {
    let db = ChargesDb::new().await;
    let other_pool = pool_with(4, &[("search_path", db.schema.name.as_str())]).await;
    let other_store = PostgresStore::new(other_pool).table("idem").unwrap();
    let (runs, entered, gate) = (
        Arc::new(AtomicUsize::new(0)),
        Arc::default(),
        Arc::default(),
    );
    let a = gated_router(
        &db,
        db.store.clone(),
        Arc::clone(&runs),
        Arc::clone(&entered),
        Arc::clone(&gate),
    );
    let b = gated_router(
        &db,
        other_store,
        Arc::clone(&runs),
        Arc::clone(&entered),
        Arc::clone(&gate),
    );
    let first = tokio::spawn(async move { charge_through(&a, "k", "hold").await });
    entered.notified().await;
    // Another body, so that a duplicate that runs does not wait for the gate.
    let during = tokio::time::timeout(Duration::from_secs(5), charge_through(&b, "k", "{}"))
        .await
        .expect("the duplicate answers");
    gate.notify_one();
    let first = first.await.unwrap();
    eprintln!(
        "first {first:?} during {during:?} runs {}",
        runs.load(SeqCst)
    );
    assert_eq!(
        during.0,
        StatusCode::CONFLICT,
        "the duplicate ran through the other name"
    );
    assert_eq!((runs.load(SeqCst), db.charges().await), (1, 1));
}

/// A pool of one connection: the first request holds it in its transaction. Its duplicate
/// must get 409 at once (the documented duplicate answer), not wait out the store's timeout.
#[tokio::test]
#[ignore = "known limit (store::postgres docs): each claimed request holds a pooled connection; with none free a duplicate waits for one and gets 503"]
async fn a_duplicate_on_a_pool_of_one_gets_409_at_once() {
    let db = ChargesDb::new().await;
    let pool = pool_with(1, &[]).await;
    let store = PostgresStore::new(pool.clone())
        .table(db.store.table_name())
        .unwrap();
    let (runs, entered, gate) = (
        Arc::new(AtomicUsize::new(0)),
        Arc::default(),
        Arc::default(),
    );
    let router = gated_router(
        &db,
        store,
        Arc::clone(&runs),
        Arc::clone(&entered),
        Arc::clone(&gate),
    );
    let first = tokio::spawn({
        let router = router.clone();
        async move { charge_through(&router, "k", "hold").await }
    });
    entered.notified().await;
    let started = std::time::Instant::now();
    let during = charge_through(&router, "k", "{}").await;
    let took = started.elapsed();
    gate.notify_one();
    let first = first.await.unwrap();
    eprintln!("during {} after {took:?}; first {}", during.0, first.0);
    assert_eq!(first.0, StatusCode::CREATED);
    assert_pool_clean(&pool).await;
    assert_eq!(during.0, StatusCode::CONFLICT, "the duplicate's answer");
    assert!(
        took < Duration::from_millis(500),
        "409 at once, took {took:?}"
    );
}

/// A pool of two, eight keys at once, each handler holding its transaction a little: some
/// requests cannot get a connection (503). Afterwards every key is either replayed or free,
/// one charge per answered key, and the pool is clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tiny_pool_under_concurrent_keys_stays_consistent_and_clean() {
    let db = ChargesDb::new().await;
    let pool = pool_with(2, &[]).await;
    let store = PostgresStore::new(pool.clone())
        .table(db.store.table_name())
        .unwrap()
        .command_timeout(Duration::from_millis(300));
    let schema = db.schema.name.clone();
    let router = Router::new().route(
        "/charges",
        post(move |claim: Claim<PostgresStore>| async move {
            let res: Result<Response, ClaimError> = async {
                let mut tx = claim.transaction().await?;
                insert_charge(&schema, &mut tx).await?;
                sqlx::query("SELECT pg_sleep(0.1)")
                    .execute(&mut *tx)
                    .await?;
                claim.commit(tx, (StatusCode::CREATED, "charged")).await
            }
            .await;
            res.unwrap_or_else(IntoResponse::into_response)
        })
        .layer(IdempotencyLayer::with_store(store.transactional())),
    );
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let router = router.clone();
            tokio::spawn(
                async move { (i, charge_through(&router, &format!("k{i}"), "{}").await.0) },
            )
        })
        .collect();
    let mut created = 0;
    for t in tasks {
        let (i, status) = t.await.unwrap();
        eprintln!("k{i}: {status}");
        created += usize::from(status == StatusCode::CREATED);
    }
    assert_eq!(db.charges().await as usize, created);
    assert_pool_clean(&pool).await;
    for i in 0..8 {
        let again = charge_through(&router, &format!("k{i}"), "{}").await;
        assert_eq!(again.0, StatusCode::CREATED, "k{i}: {again:?}");
    }
    assert_eq!(db.charges().await, 8);
    assert_pool_clean(&pool).await;
}

/// The store's timeout firing anywhere in the claim (its read, the pool, the BEGIN): a 1.5 ms
/// timeout on 100 keys. Afterwards, through a store with the default timeout on the same
/// pool, every key that was not answered 201 is free at once, and the pool is clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_store_timeout_firing_mid_claim_leaves_nothing_behind() {
    let db = ChargesDb::new().await;
    let fast = db
        .store
        .clone()
        .command_timeout(Duration::from_micros(1500));
    let (runs, entered, gate) = (
        Arc::new(AtomicUsize::new(0)),
        Arc::default(),
        Arc::default(),
    );
    let hurried = gated_router(
        &db,
        fast,
        Arc::clone(&runs),
        Arc::clone(&entered),
        Arc::clone(&gate),
    );
    let normal = gated_router(&db, db.store.clone(), runs, entered, gate);
    let tasks: Vec<_> = (0..100)
        .map(|i| {
            let router = hurried.clone();
            tokio::spawn(async move { charge_through(&router, &format!("k{i}"), "{}").await.0 })
        })
        .collect();
    let mut statuses = Vec::new();
    for t in tasks {
        statuses.push(t.await.unwrap());
    }
    let timed_out = statuses.iter().filter(|s| s.is_server_error()).count();
    eprintln!("{timed_out} of 100 timed out");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_pool_clean(db.pool()).await;
    let mut conflicts = 0;
    for (i, status) in statuses.iter().enumerate() {
        let again = charge_through(&normal, &format!("k{i}"), "{}").await;
        if *status == StatusCode::CREATED {
            assert!(again.1, "k{i} answered 201 but not replayed: {again:?}");
        } else if again.0 == StatusCode::CONFLICT {
            conflicts += 1;
        } else {
            assert_eq!(again.0, StatusCode::CREATED, "k{i}: {again:?}");
        }
    }
    assert_eq!(conflicts, 0, "keys still taken after their claim timed out");
    assert_eq!(db.charges().await, 100);
}

/// A handler that takes the transaction, charges, drops it (rolled back) and still answers
/// 201. The layer knows nothing committed (the slot says rolled back): a 201 must mean the
/// charge happened, or the client, who will not retry a 201, is charged zero times.
#[tokio::test]
#[ignore = "known limit (Claim::transaction docs): a handler that drops its transaction and answers success is answered as it says; nothing is stored, a retry runs it again"]
async fn a_201_after_the_transaction_was_dropped_is_not_passed_off_as_done() {
    let db = ChargesDb::new().await;
    let schema = db.schema.name.clone();
    let router = Router::new().route(
        "/charges",
        post(move |claim: Claim<PostgresStore>| async move {
            let res: Result<Response, ClaimError> = async {
                let mut tx = claim.transaction().await?;
                insert_charge(&schema, &mut tx).await?;
                drop(tx);
                Ok((StatusCode::CREATED, "charged").into_response())
            }
            .await;
            res.unwrap_or_else(IntoResponse::into_response)
        })
        .layer(IdempotencyLayer::with_store(
            db.store.clone().transactional(),
        )),
    );
    let first = charge_through(&router, "k", "{}").await;
    let charges = db.charges().await;
    eprintln!("first {first:?}, charges {charges}");
    let retry = charge_through(&router, "k", "{}").await;
    eprintln!("retry {retry:?}");
    assert!(
        first.0 != StatusCode::CREATED || charges == 1,
        "201 with no charge"
    );
}

/// Every transaction `REPEATABLE READ` (the pool's default): the lock function's check for a
/// committed record reads the transaction's snapshot, taken when its statement began, before
/// the lock was taken. Two requests per key, 300 keys: the handler must run once per key.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn at_repeatable_read_a_duplicate_racing_the_commit_never_runs() {
    duplicates_racing_the_commit_run_once("repeatable\\ read").await;
}

/// The same at `SERIALIZABLE`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn at_serializable_a_duplicate_racing_the_commit_never_runs() {
    duplicates_racing_the_commit_run_once("serializable").await;
}

/// Control: the same at `READ COMMITTED` (each statement of the lock function reads anew).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn at_read_committed_a_duplicate_racing_the_commit_never_runs() {
    duplicates_racing_the_commit_run_once("read\\ committed").await;
}

async fn duplicates_racing_the_commit_run_once(isolation: &str) {
    let db = ChargesDb::new().await;
    let pool = pool_with(8, &[("default_transaction_isolation", isolation)]).await;
    let store = PostgresStore::new(pool.clone())
        .table(db.store.table_name())
        .unwrap();
    let schema = db.schema.name.clone();
    let runs: Arc<std::sync::Mutex<std::collections::HashMap<String, usize>>> = Arc::default();
    let router = Router::new().route(
        "/charges",
        post({
            let runs = Arc::clone(&runs);
            move |claim: Claim<PostgresStore>, body: String| async move {
                *runs.lock().unwrap().entry(body).or_default() += 1;
                let res: Result<Response, ClaimError> = async {
                    let mut tx = claim.transaction().await?;
                    insert_charge(&schema, &mut tx).await?;
                    claim.commit(tx, (StatusCode::CREATED, "charged")).await
                }
                .await;
                res.unwrap_or_else(IntoResponse::into_response)
            }
        })
        .layer(IdempotencyLayer::with_store(store.transactional())),
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let mut keys = 0;
    while keys < 300 && std::time::Instant::now() < deadline {
        let key = format!("k{keys}");
        let tries: Vec<_> = (0..4)
            .map(|_| {
                let (router, key) = (router.clone(), key.clone());
                tokio::spawn(async move { charge_through(&router, &key, &key).await.0 })
            })
            .collect();
        for t in tries {
            t.await.unwrap();
        }
        keys += 1;
    }
    let twice: Vec<_> = runs
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(k, n)| format!("{k}:{n}"))
        .collect();
    eprintln!(
        "{keys} keys, ran more than once: {twice:?}, charges {}",
        db.charges().await
    );
    assert!(twice.is_empty(), "{twice:?}");
}
