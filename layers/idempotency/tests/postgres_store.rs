//! `PostgresStore` against the machine's Postgres, each test in a schema of its own (the
//! `store::postgres` docs: one statement per operation; a fresh request costs 2 round trips, a
//! replay 1; records are fenced by the token and the database's clock; while Postgres is
//! unreachable the layer answers `503` without running handlers and recovers on its own).
#![cfg(all(feature = "postgres", feature = "conformance"))]

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use sqlx::postgres::PgPoolOptions;
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;
use tower::{Layer, ServiceExt};
use tower_once_idempotency::fingerprint::Fingerprint;
use tower_once_idempotency::store::conformance::{RealClock, Suite};
use tower_once_idempotency::store::postgres::PostgresStore;
use tower_once_idempotency::store::{ClaimOutcome, ClaimToken, IdempotencyStore, StoreKey};
use tower_once_idempotency::{IdempotencyLayer, RequestBody};
use tower_once_test_support::postgres::{database_url, Schema};

/// Leases short enough for a real clock, long enough for a loaded 2-core machine.
const LEASE: Duration = Duration::from_millis(400);

mod support;

use support::postgres_store as store_in;

/// A pool whose connections are named, to tell them apart in `pg_stat_activity`.
async fn named_pool(max: u32) -> sqlx::PgPool {
    let options: sqlx::postgres::PgConnectOptions = database_url().parse().unwrap();
    PgPoolOptions::new()
        .max_connections(max)
        .connect_with(options.application_name("tower-once-store-test"))
        .await
        .unwrap()
}

type Handler = tower::util::BoxCloneSyncService<
    Request<RequestBody<Full<Bytes>>>,
    Response<Full<Bytes>>,
    Infallible,
>;

fn counting_handler(delay: Duration) -> (Handler, Arc<AtomicUsize>) {
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&runs);
    let handler = tower::service_fn(move |_req: Request<RequestBody<Full<Bytes>>>| {
        let n = counter.fetch_add(1, SeqCst) + 1;
        async move {
            tokio::time::sleep(delay).await;
            Ok::<_, Infallible>(
                Response::builder()
                    .status(StatusCode::CREATED)
                    .header("x-run", n.to_string())
                    .body(Full::new(Bytes::from(format!("charge {n}"))))
                    .unwrap(),
            )
        }
    });
    (tower::util::BoxCloneSyncService::new(handler), runs)
}

fn keyed(key: &str, body: &'static str) -> Request<Full<Bytes>> {
    Request::post("/charges")
        .header("idempotency-key", key)
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .unwrap()
}

#[tokio::test]
async fn postgres_store_keeps_the_contract() {
    let schema = Schema::create();
    let store = store_in(&schema).await;
    Suite::new(store, RealClock)
        .durations(LEASE, LEASE)
        .run()
        .await;
}

#[tokio::test]
async fn concurrent_duplicates_run_once_and_replay_the_stored_response() {
    let schema = Schema::create();
    let store = store_in(&schema).await;
    let (handler, runs) = counting_handler(Duration::from_millis(100));
    let svc = IdempotencyLayer::with_store(store.clone()).layer(handler);
    let tasks: Vec<_> = (0..32)
        .map(|_| {
            let svc = svc.clone();
            tokio::spawn(async move { svc.oneshot(keyed("k-1", "{\"amount\":5}")).await.unwrap() })
        })
        .collect();
    let mut statuses = Vec::new();
    for task in tasks {
        statuses.push(task.await.unwrap().status());
    }
    assert_eq!(runs.load(SeqCst), 1, "one handler run for 32 duplicates");
    assert!(statuses
        .iter()
        .all(|s| *s == StatusCode::CREATED || *s == StatusCode::CONFLICT));

    let replay = svc
        .clone()
        .oneshot(keyed("k-1", "{\"amount\":5}"))
        .await
        .unwrap();
    assert_eq!(replay.status(), StatusCode::CREATED);
    assert_eq!(replay.headers()["x-run"], "1");
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    let body = replay.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, "charge 1");
    // Replays read the record and write nothing, not even a row lock (xmax stays 0).
    let xmax: String =
        sqlx::query_scalar(&format!("SELECT xmax::text FROM {}", store.table_name()))
            .fetch_one(store.pool())
            .await
            .unwrap();
    assert_eq!(xmax, "0", "a replay locked or rewrote the record");

    let reuse = svc.oneshot(keyed("k-1", "{\"amount\":6}")).await.unwrap();
    assert_eq!(reuse.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(runs.load(SeqCst), 1);
}

#[tokio::test]
async fn bad_table_names_are_refused_before_any_sql() {
    let pool = PgPoolOptions::new().connect_lazy(&database_url()).unwrap();
    for bad in ["", "Idem", "user", "a.b.c", "x; DROP TABLE y", "1x"] {
        let error = PostgresStore::new(pool.clone()).table(bad).unwrap_err();
        assert!(
            error.to_string().starts_with("table name:"),
            "{bad:?}: {error}"
        );
    }
}

#[tokio::test]
async fn a_dropped_table_fails_closed_with_its_cause_and_recovers_after_migrate() {
    let schema = Schema::create();
    let store = store_in(&schema).await;
    let (handler, runs) = counting_handler(Duration::ZERO);
    let svc = IdempotencyLayer::with_store(store.clone()).layer(handler);
    sqlx::query(&format!("DROP TABLE {}", store.table_name()))
        .execute(store.pool())
        .await
        .unwrap();

    let error = store
        .claim(
            StoreKey::from_bytes([7; 32]),
            ClaimToken::new(),
            Fingerprint::from_bytes([0; 32]),
            LEASE,
        )
        .await
        .unwrap_err();
    assert!(error.is_unavailable(), "{error}");
    assert!(error.to_string().contains("does not exist"), "{error}");
    let refused = svc.clone().oneshot(keyed("k-2", "{}")).await.unwrap();
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(runs.load(SeqCst), 0, "no handler run without a claim");

    store.migrate().await.unwrap();
    let served = svc.oneshot(keyed("k-2", "{}")).await.unwrap();
    assert_eq!(served.status(), StatusCode::CREATED);
    assert_eq!(runs.load(SeqCst), 1);
}

#[tokio::test]
async fn a_killed_backend_and_a_full_pool_answer_503_then_recover() {
    let schema = Schema::create();
    // Named, so that only this pool's backend is killed, not those of tests beside it.
    let options: sqlx::postgres::PgConnectOptions = database_url().parse().unwrap();
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(Duration::from_millis(200))
        .connect_with(options.application_name("tower-once-killed-backend"))
        .await
        .unwrap();
    let store = PostgresStore::new(pool)
        .table(&format!("{}.idem", schema.name))
        .unwrap()
        .command_timeout(Duration::from_millis(300));
    store.migrate().await.unwrap();
    let (handler, runs) = counting_handler(Duration::ZERO);
    let svc = IdempotencyLayer::with_store(store.clone()).layer(handler);

    // A full pool: the one connection is held elsewhere.
    let held = store.pool().acquire().await.unwrap();
    let refused = svc.clone().oneshot(keyed("k-3", "{}")).await.unwrap();
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    drop(held);

    // A killed backend: the pooled connection is terminated from another session.
    let admin = PgPoolOptions::new()
        .max_connections(1)
        .connect(&database_url())
        .await
        .unwrap();
    sqlx::query(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE datname = current_database() AND application_name = 'tower-once-killed-backend'",
    )
    .execute(&admin)
    .await
    .unwrap();
    // The first request may meet the dead connection (503); the pool then replaces it.
    let mut served = None;
    for _ in 0..5 {
        let response = svc.clone().oneshot(keyed("k-3", "{}")).await.unwrap();
        if response.status() == StatusCode::CREATED {
            served = Some(response);
            break;
        }
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    }
    assert!(served.is_some(), "recovered without a restart");
    assert_eq!(runs.load(SeqCst), 1);
    let replay = svc.oneshot(keyed("k-3", "{}")).await.unwrap();
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
}

#[tokio::test]
async fn expired_records_count_as_absent_and_fresh_claims_purge_them() {
    let schema = Schema::create();
    let store = store_in(&schema).await;
    let fp = Fingerprint::from_bytes([1; 32]);
    let claim = |store: PostgresStore, i: u16, lease: Duration| async move {
        let mut key = [0; 32];
        key[..2].copy_from_slice(&i.to_be_bytes());
        let outcome = store
            .claim(StoreKey::from_bytes(key), ClaimToken::new(), fp, lease)
            .await
            .unwrap();
        assert!(matches!(outcome, ClaimOutcome::Claimed), "{i}");
    };
    let count = |store: PostgresStore, filter: &'static str| async move {
        let sql = format!("SELECT count(*) FROM {} {filter}", store.table_name());
        sqlx::query_scalar::<_, i64>(&sql)
            .fetch_one(store.pool())
            .await
            .unwrap()
    };
    for i in 0..50 {
        claim(store.clone(), i, LEASE).await;
    }
    // Expired all at once, after every claim (a lease of a millisecond let the later claims of
    // a slow run purge the earlier ones before the count below).
    sqlx::query(&format!(
        "UPDATE {} SET expires_at = clock_timestamp() - interval '1 second'",
        store.table_name()
    ))
    .execute(store.pool())
    .await
    .unwrap();
    // Expired, they count as absent: claimable again.
    claim(store.clone(), 0, LEASE).await;
    assert!(count(store.clone(), "WHERE expires_at <= clock_timestamp()").await > 0);
    // One fresh claim in eight deletes up to sixteen: 300 claims delete them all (but with a
    // chance below 1e-9).
    for i in 1000..1300 {
        claim(store.clone(), i, LEASE * 10).await;
    }
    assert_eq!(
        count(store.clone(), "WHERE expires_at <= clock_timestamp()").await,
        0
    );
    assert_eq!(store.purge_expired(100).await.unwrap(), 0);
    // On demand: `purge_expired` deletes what has expired, up to its limit.
    for i in 2000..2005 {
        claim(store.clone(), i, Duration::from_millis(1)).await;
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    let expired = count(store.clone(), "WHERE expires_at <= clock_timestamp()").await;
    assert_eq!(store.purge_expired(100).await.unwrap(), expired as u64);
    assert_eq!(
        count(store.clone(), "WHERE expires_at <= clock_timestamp()").await,
        0
    );
}

#[tokio::test]
async fn a_system_schema_is_refused_as_the_tables_schema() {
    // `pg_temp` would give every pooled connection a private table of its own (two replicas,
    // or two connections, would each claim the same key); `pg_catalog` and `pg_toast` are not
    // for user tables. Postgres reserves the `pg_` prefix for system schemas.
    let pool = PgPoolOptions::new().connect_lazy(&database_url()).unwrap();
    for bad in [
        "pg_temp.idem",
        "pg_catalog.idem",
        "pg_toast.idem",
        "pg_temp_3.idem",
    ] {
        let refused = PostgresStore::new(pool.clone()).table(bad);
        assert!(refused.is_err(), "{bad:?} accepted");
    }
    assert!(PostgresStore::new(pool).table("app.pg_idem").is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_claims_releases_and_purges_never_give_a_key_two_owners() {
    let schema = Schema::create();
    let store = PostgresStore::new(named_pool(8).await)
        .table(&format!("{}.idem", schema.name))
        .unwrap();
    store.migrate().await.unwrap();
    let fp = Fingerprint::from_bytes([3; 32]);
    let hot = [StoreKey::from_bytes([1; 32]), StoreKey::from_bytes([2; 32])];
    let holders: Arc<[AtomicUsize; 2]> = Arc::new([AtomicUsize::new(0), AtomicUsize::new(0)]);
    let wins = Arc::new(AtomicUsize::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    // Twelve tasks fight over two keys: whoever wins holds the key (a long lease), then
    // releases it, so the claim function keeps meeting rows deleted between its two reads.
    for t in 0..12usize {
        let (store, holders, wins) = (store.clone(), Arc::clone(&holders), Arc::clone(&wins));
        tasks.spawn(async move {
            let mut errors = Vec::new();
            for _ in 0..60 {
                let k = t % 2;
                let token = ClaimToken::new();
                match store
                    .claim(hot[k], token, fp, Duration::from_secs(30))
                    .await
                {
                    Ok(ClaimOutcome::Claimed) => {
                        wins.fetch_add(1, SeqCst);
                        let before = holders[k].fetch_add(1, SeqCst);
                        assert_eq!(before, 0, "two owners of one key at once");
                        tokio::task::yield_now().await;
                        holders[k].fetch_sub(1, SeqCst);
                        assert!(
                            store.release(hot[k], token).await.unwrap(),
                            "ours to release"
                        );
                    }
                    Ok(ClaimOutcome::Existing(_)) => {}
                    Err(error) => errors.push(error.to_string()),
                }
            }
            errors
        });
    }
    // Meanwhile: fresh keys on 1 ms leases (each claim purges expired rows), and purges.
    for t in 0..2u8 {
        let store = store.clone();
        tasks.spawn(async move {
            let mut errors = Vec::new();
            for i in 0..120u8 {
                let key = StoreKey::from_bytes([
                    100 + t,
                    i,
                    0,
                    0,
                    0,
                    0,
                    0,
                    0,
                    0,
                    0,
                    0,
                    0,
                    0,
                    0,
                    0,
                    0,
                    0,
                    0,
                    0,
                    0,
                    0,
                    0,
                    0,
                    0,
                    0,
                    0,
                    0,
                    0,
                    0,
                    0,
                    0,
                    0,
                ]);
                if let Err(error) = store
                    .claim(key, ClaimToken::new(), fp, Duration::from_millis(1))
                    .await
                {
                    errors.push(error.to_string());
                }
                if i % 10 == 0 {
                    if let Err(error) = store.purge_expired(5).await {
                        errors.push(error.to_string());
                    }
                }
            }
            errors
        });
    }
    let mut errors = Vec::new();
    while let Some(done) = tasks.join_next().await {
        errors.extend(done.unwrap());
    }
    assert!(
        errors.is_empty(),
        "no claim fails under ordinary load: {errors:?}"
    );
    assert!(wins.load(SeqCst) >= 2, "both keys were won");
}

#[tokio::test]
async fn purging_expired_records_reads_them_through_the_index_not_the_whole_table() {
    let schema = Schema::create();
    let pool = named_pool(1).await;
    let store = PostgresStore::new(pool.clone())
        .table(&format!("{}.idem", schema.name))
        .unwrap();
    store.migrate().await.unwrap();
    let t = store.table_name().to_owned();
    // 200 000 records, of which the first 100 have expired.
    sqlx::query(&format!(
        "INSERT INTO {t} (key, token, state, fingerprint, expires_at, claimed_at, status, body) \
         SELECT sha256(g::text::bytea), gen_random_uuid(), 'completed', sha256(g::text::bytea), \
           CASE WHEN g <= 100 THEN now() - interval '1 hour' ELSE now() + interval '1 day' END, \
           now(), 200, ''::bytea FROM generate_series(1, 200000) g"
    ))
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query(&format!("ANALYZE {t}"))
        .execute(&pool)
        .await
        .unwrap();
    // (rows read by sequential scans, index entries read, rows deleted, rows inserted), once
    // the backend's counters are flushed to where every session reads them.
    let stats = |pool: sqlx::PgPool, t: String| async move {
        sqlx::query("SELECT pg_stat_force_next_flush()")
            .execute(&pool)
            .await
            .unwrap();
        sqlx::query_as::<_, (i64, i64, i64, i64)>(&format!(
            "SELECT coalesce(seq_tup_read, 0), \
               (SELECT coalesce(sum(idx_tup_read), 0)::int8 FROM pg_stat_user_indexes \
                WHERE relid = '{t}'::regclass), n_tup_del, n_tup_ins \
             FROM pg_stat_user_tables WHERE relid = '{t}'::regclass"
        ))
        .fetch_one(&pool)
        .await
        .unwrap()
    };
    let mut before = stats(pool.clone(), t.clone()).await;
    for _ in 0..50 {
        if before.3 >= 200_000 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        before = stats(pool.clone(), t.clone()).await;
    }
    assert_eq!(before.3, 200_000, "the counters were flushed");
    assert_eq!(store.purge_expired(1000).await.unwrap(), 100);
    let mut after = stats(pool.clone(), t.clone()).await;
    for _ in 0..50 {
        if after.2 >= before.2 + 100 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        after = stats(pool.clone(), t.clone()).await;
    }
    assert_eq!(after.2, before.2 + 100, "the counters were flushed");
    assert_eq!(
        after.0 - before.0,
        0,
        "no sequential scan: {before:?} {after:?}"
    );
    assert!(
        after.1 - before.1 < 1000,
        "index entries read: only the expired ones and their keys: {before:?} {after:?}"
    );
}
