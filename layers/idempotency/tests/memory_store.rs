//! The in-memory store's bounds and fairness (`MemoryStore` docs: "Fair
//! between scopes"), through the store's public API
//! and through the layer on an axum `Router`: byte pressure drops responses but never a key whose
//! handler ran, and a tenant's flood of fresh keys or claims in progress never costs another tenant
//! a completed record. Paused time.

mod support;

use http::StatusCode;
use std::time::Duration;
use support::{post, send, Handler};
use tower::Layer;
use tower_once_idempotency::fingerprint::Fingerprint;
use tower_once_idempotency::store::{
    ClaimOutcome, ClaimToken, Completion, IdempotencyStore, MemoryStore, RecordState, StoreKey,
    StoredResponse,
};
use tower_once_idempotency::IdempotencyLayer;

const FP: Fingerprint = Fingerprint::from_bytes([9; 32]);
const LEASE: Duration = Duration::from_secs(10);
const DAY: Duration = Duration::from_secs(86_400);

fn key(n: u8, scope: &[u8]) -> StoreKey {
    let mut bytes = [n; 32];
    bytes[31] = scope.len() as u8;
    StoreKey::from_bytes(bytes).with_scope(scope)
}

fn response(len: usize) -> Completion {
    Completion::Response(StoredResponse::new(
        StatusCode::OK,
        Default::default(),
        vec![b'x'; len].into(),
    ))
}

async fn claim(store: &MemoryStore, key: StoreKey) -> ClaimToken {
    let token = ClaimToken::new();
    match store.claim(key, token, FP, LEASE).await {
        Ok(ClaimOutcome::Claimed) => token,
        other => panic!("expected a fresh claim, got {other:?}"),
    }
}

async fn state(store: &MemoryStore, key: StoreKey) -> &'static str {
    match store.claim(key, ClaimToken::new(), FP, LEASE).await {
        Ok(ClaimOutcome::Claimed) => "absent (a retry would run the handler again)",
        Ok(ClaimOutcome::Existing(r)) => match r.state {
            RecordState::Completed(_) => "completed",
            RecordState::NotReplayable => "not-replayable",
            RecordState::InProgress { .. } => "in-progress",
        },
        Err(e) if e.is_full() => "full",
        Err(_) => "error",
    }
}

/// Byte pressure never evicts a not-replayable record: it holds zero bytes, so evicting it would
/// free nothing, and the key whose handler already ran would become absent, its retry running the
/// handler a second time. Was broken: the victims came from an index that also held not-replayable
/// records, and the byte loop took the oldest whatever its size.
#[tokio::test(start_paused = true)]
async fn byte_pressure_never_evicts_a_zero_byte_not_replayable_record() {
    // 10 entries: one shard, exact bounds.
    let store = MemoryStore::builder()
        .max_entries(10)
        .max_bytes(1_000)
        .build();
    // A response too large to store was streamed: the key is kept as not replayable.
    let streamed = key(1, b"");
    let t = claim(&store, streamed).await;
    assert!(store
        .complete(streamed, t, Completion::NotReplayable, DAY)
        .await
        .unwrap());
    tokio::time::advance(Duration::from_secs(1)).await;
    // Two ordinary responses that do not fit together.
    let y = key(2, b"");
    let t = claim(&store, y).await;
    assert!(store.complete(y, t, response(600), DAY).await.unwrap());
    tokio::time::advance(Duration::from_secs(1)).await;
    let z = key(3, b"");
    let t = claim(&store, z).await;
    assert!(store.complete(z, t, response(500), DAY).await.unwrap());
    assert_eq!(
        state(&store, streamed).await,
        "not-replayable",
        "a zero-byte record was evicted to make room for bytes"
    );
}

/// A scope flooding the store with in-progress claims (slow or hanging requests, renewed leases)
/// holds the most but has nothing evictable: its flood never makes a bystander pay, so an ordinary
/// third tenant's new key never evicts tenant B's completed payment ("the scope holding the most
/// pays"). Was broken: `Shard::victim` skipped the flooder and made the next largest scope pay.
#[tokio::test(start_paused = true)]
async fn an_in_progress_flood_never_makes_a_bystander_scope_pay() {
    let store = MemoryStore::builder().max_entries(10).build();
    let mut payments = Vec::new();
    for n in 0..3 {
        let k = key(10 + n, b"tenant-b");
        let t = claim(&store, k).await;
        assert!(store.complete(k, t, response(10), DAY).await.unwrap());
        payments.push(k);
    }
    // Tenant A: six claims in progress (its handlers are slow; leases renewed).
    for n in 0..6 {
        claim(&store, key(20 + n, b"tenant-a")).await;
    }
    // Tenant C: ordinary traffic.
    claim(&store, key(30, b"tenant-c")).await;
    let _ = store
        .claim(key(31, b"tenant-c"), ClaimToken::new(), FP, LEASE)
        .await;
    for p in &payments {
        assert_eq!(
            state(&store, *p).await,
            "completed",
            "tenant B (3 records) paid for room while tenant A held the most (6)"
        );
    }
}

/// With many shards (max_entries >= 4096), a flood of fresh keys from
/// one scope, completed, never evicts another scope's completed record in any shard.
#[tokio::test(start_paused = true)]
async fn multi_shard_flood_evicts_only_the_flooder() {
    let store = MemoryStore::builder().max_entries(4_096).build();
    let mut victims = Vec::new();
    for n in 0..64u32 {
        let mut bytes = [0u8; 32];
        bytes[..4].copy_from_slice(&n.to_le_bytes());
        bytes[4] = 0xbb;
        let k = StoreKey::from_bytes(bytes).with_scope(b"tenant-b");
        let t = claim(&store, k).await;
        assert!(store.complete(k, t, response(10), DAY).await.unwrap());
        victims.push(k);
    }
    for n in 0..6_000u32 {
        let mut bytes = [0u8; 32];
        bytes[..4].copy_from_slice(&n.to_le_bytes());
        bytes[4] = 0xaa;
        let k = StoreKey::from_bytes(bytes).with_scope(b"tenant-a");
        let t = ClaimToken::new();
        if let Ok(ClaimOutcome::Claimed) = store.claim(k, t, FP, LEASE).await {
            store.complete(k, t, response(10), DAY).await.unwrap();
        }
    }
    for v in &victims {
        assert_eq!(state(&store, *v).await, "completed");
    }
}

/// Was broken by `Shard::victim`'s tie rule: a tenant whose claims are all in progress tied
/// with a bystander for "the scope that holds the most", the tie went to "one with something
/// to give", and the flooder's new claim evicted the bystander's completed payment. The
/// claimer now counts as the largest whenever it holds as much as any other scope: it pays
/// with its own records or is refused. (A tenant holding strictly less than another may still
/// take room from the larger one: that is the documented "largest pays" share.)
#[tokio::test(start_paused = true)]
async fn an_in_progress_flood_at_parity_never_evicts_a_bystanders_payment() {
    let store = MemoryStore::builder().max_entries(10).build();
    let mut payments = Vec::new();
    for n in 0..5 {
        let k = key(10 + n, b"tenant-b");
        let t = claim(&store, k).await;
        assert!(store.complete(k, t, response(10), DAY).await.unwrap());
        payments.push(k);
    }
    // Tenant A floods with fresh keys whose handlers hang: 5 claims fill the store...
    for n in 0..5 {
        claim(&store, key(20 + n, b"tenant-a")).await;
    }
    // ...and its next fresh keys must be refused (A has nothing of its own to give).
    for n in 5..8 {
        let _ = store
            .claim(key(20 + n, b"tenant-a"), ClaimToken::new(), FP, LEASE)
            .await;
    }
    for p in &payments {
        assert_eq!(
            state(&store, *p).await,
            "completed",
            "tenant A's flood of claims evicted tenant B's completed payment"
        );
    }
}

/// Through the real layer on an axum `Router`, tenants scoped by a header, paused time.
mod through_the_layer {
    use super::support::{post_with, send};
    use axum::routing;
    use axum::Router;
    use http::StatusCode;

    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use tower_once_idempotency::scope::HeaderScope;
    use tower_once_idempotency::store::MemoryStore;
    use tower_once_idempotency::IdempotencyLayer;

    type Runs = Arc<Mutex<HashMap<String, usize>>>;

    const RETENTION: Duration = Duration::from_secs(60);

    fn app(store: MemoryStore, runs: Runs) -> Router {
        Router::new()
            .route(
                "/charges",
                routing::post(move |headers: http::HeaderMap, body: String| {
                    let tenant = headers["x-tenant"].to_str().unwrap().to_owned();
                    let mut runs = runs.lock().unwrap();
                    let n = runs.entry(tenant.clone()).or_default();
                    *n += 1;
                    let answer = format!("{tenant} charge {n}: {body}");
                    async move { (StatusCode::CREATED, answer) }
                }),
            )
            .layer(
                IdempotencyLayer::with_store(store)
                    .scope(HeaderScope::new("x-tenant"))
                    .retention(RETENTION),
            )
    }

    async fn post_charge(app: &Router, tenant: &str, key: &str, body: &str) -> (StatusCode, bool) {
        let req = post_with(
            "/charges",
            &[("idempotency-key", key), ("x-tenant", tenant)],
            body,
        );
        let answer = send(app, req).await;
        (answer.status, answer.replayed())
    }

    /// Tenant A floods fresh keys into a full store (one shard of 6 entries: at parity once A holds
    /// 3); tenant B's three payments are replayed all the while, and A is answered 201 (paying with
    /// its own records) or 503, never at B's expense. Exactly at the retention B's record is gone:
    /// a retry runs the handler again, and a changed body is a new charge, not a 422.
    #[tokio::test(start_paused = true)]
    async fn a_tenants_flood_never_costs_another_tenant_a_payment_and_retention_is_exact() {
        let store = MemoryStore::builder().max_entries(6).build();
        let runs = Runs::default();
        let app = app(store.clone(), runs.clone());
        for k in ["b0", "b1", "b2"] {
            assert_eq!(
                post_charge(&app, "b", k, "10 EUR").await,
                (StatusCode::CREATED, false)
            );
        }
        tokio::time::advance(Duration::from_secs(1)).await;
        for n in 0..40 {
            let (status, replayed) = post_charge(&app, "a", &format!("a{n}"), "1 EUR").await;
            assert!(!replayed);
            assert!(
                status == StatusCode::CREATED || status == StatusCode::SERVICE_UNAVAILABLE,
                "{status}"
            );
            for k in ["b0", "b1", "b2"] {
                assert_eq!(
                    post_charge(&app, "b", k, "10 EUR").await,
                    (StatusCode::CREATED, true),
                    "B's payment {k} was not replayed during A's flood (request a{n})"
                );
            }
        }
        assert_eq!(runs.lock().unwrap()["b"], 3);
        assert!(store.len() <= 6);
        // B's records were completed at t=0 with a retention of 60 s; now is t=1 s.
        tokio::time::advance(RETENTION - Duration::from_secs(1) - Duration::from_millis(1)).await;
        assert_eq!(
            post_charge(&app, "b", "b0", "10 EUR").await,
            (StatusCode::CREATED, true)
        );
        assert_eq!(
            post_charge(&app, "b", "b1", "20 EUR").await.0,
            StatusCode::UNPROCESSABLE_ENTITY
        );
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(
            post_charge(&app, "b", "b0", "10 EUR").await,
            (StatusCode::CREATED, false),
            "a record exactly at its retention was replayed"
        );
        assert_eq!(
            post_charge(&app, "b", "b1", "20 EUR").await,
            (StatusCode::CREATED, false),
            "a record exactly at its retention answered 422"
        );
        assert_eq!(runs.lock().unwrap()["b"], 5);
    }
}

/// Was broken: a completion with a retention of zero (accepted by the store's API; the layer
/// refuses it) made room for its response, which no one can ever get (a record is never
/// answered at its end): another tenant's live response went, and its retry got 409 instead of
/// its replay. Expired records make room before live ones pay; this one was expired at birth.
#[tokio::test(start_paused = true)]
async fn a_completion_born_expired_never_costs_a_live_response() {
    let store = MemoryStore::builder()
        .max_entries(10)
        .max_bytes(1_000)
        .build();
    let live = key(1, b"tenant-b");
    let t = claim(&store, live).await;
    assert!(store.complete(live, t, response(600), DAY).await.unwrap());
    let born_expired = key(2, b"tenant-a");
    let t = claim(&store, born_expired).await;
    assert!(store
        .complete(born_expired, t, response(600), Duration::ZERO)
        .await
        .unwrap());
    assert_eq!(state(&store, live).await, "completed");
    assert_eq!(
        state(&store, born_expired).await,
        "absent (a retry would run the handler again)",
        "at its end: never answered"
    );
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
    let svc = IdempotencyLayer::new().store(store).layer(handler.clone());
    let first = send(&svc, post("/c?big=600", Some("old"), "x")).await;
    assert_eq!(first.status, StatusCode::CREATED);
    let second = send(&svc, post("/c?big=600", Some("new"), "x")).await;
    assert_eq!(second.status, StatusCode::CREATED);
    assert_eq!(handler.runs(), 2);

    let replay = send(&svc, post("/c?big=600", Some("new"), "x")).await;
    assert!(replay.replayed(), "the newer response is kept");
    let retry = send(&svc, post("/c?big=600", Some("old"), "x")).await;
    assert_eq!(retry.status, StatusCode::CONFLICT);
    assert_eq!(
        retry.problem_type(),
        "urn:tower-once:idempotency:not-replayable"
    );
    assert_eq!(handler.runs(), 2, "the older key's handler ran again");
}
