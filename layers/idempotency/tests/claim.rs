//! The claim, whichever way the store answers it (crate docs "What happens to a request"): a store
//! whose claim future is ready on the first poll goes straight to the handler, without the `Claim`
//! state, and every promise of the table is checked for a claim answered at once and for claims
//! that are pending (once, with spurious wake-ups, over a delay), lost or panicking: replays,
//! conflicts, mismatches, renewed leases, stored or released records, and never a second run. Many
//! concurrent duplicates make one claim; a request dropped while its claim is in flight frees the
//! key at once; the handler sees its claim's `ClaimToken` and the record's `StoreKey` (step 5),
//! the same key for the same request.
//! Paused time; every test counts handler runs.

use bytes::Bytes;
use futures_util::FutureExt;
use http::{Response, StatusCode};
use http_body_util::Full;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tower::{Layer, Service, ServiceExt};
use tower_once_idempotency::fingerprint::Fingerprint;
use tower_once_idempotency::store::{
    ClaimOutcome, ClaimToken, Completion, IdempotencyStore, MemoryStore, StoreError, StoreKey,
};
use tower_once_idempotency::IdempotencyLayer;

mod support;

use support::{post, send, Handler, Req};

type Boxed<T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send>>;

/// How the store answers a claim. The claim always takes effect when `claim` is called.
#[derive(Clone, Copy, Debug)]
enum Claims {
    /// Ready on the first poll.
    AtOnce,
    /// `Pending` (waking itself) this many times, then ready.
    Spurious(u32),
    /// Ready after this many milliseconds (a network store).
    Delay(u64),
}

const MODES: [Claims; 4] = [
    Claims::AtOnce,
    Claims::Spurious(1),
    Claims::Spurious(3),
    Claims::Delay(100),
];

/// A future that is `Pending` `pendings` times (waking itself each time), then answers, or
/// panics when it would answer.
struct Scripted<T> {
    pendings: u32,
    answer: Option<Result<T, StoreError>>,
    panic: bool,
}

impl<T: Unpin> Future for Scripted<T> {
    type Output = Result<T, StoreError>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if self.pendings > 0 {
            self.pendings -= 1;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        if self.panic {
            panic!("the store's claim future panicked");
        }
        Poll::Ready(self.answer.take().expect("polled after its answer"))
    }
}

fn answer<T: Send + Unpin + 'static>(
    claims: Claims,
    result: Result<T, StoreError>,
    panic: bool,
) -> Boxed<T> {
    match claims {
        Claims::AtOnce => Box::pin(Scripted {
            pendings: 0,
            answer: Some(result),
            panic,
        }),
        Claims::Spurious(n) => Box::pin(Scripted {
            pendings: n,
            answer: Some(result),
            panic,
        }),
        Claims::Delay(ms) => Box::pin(async move {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            if panic {
                panic!("the store's claim future panicked");
            }
            result
        }),
    }
}

/// A memory store whose claim answers as `claims` says, whose writes (complete, release) take
/// `writes`, and which counts lease renewals. `lost` claims land but answer an error (the reply
/// was lost); `panics` claims land and then panic.
#[derive(Clone)]
struct Store {
    memory: MemoryStore,
    claims: Claims,
    writes: Duration,
    extends: Arc<AtomicUsize>,
    lost: Arc<AtomicUsize>,
    panics: Arc<AtomicUsize>,
}

impl Store {
    fn new(claims: Claims) -> Self {
        Self {
            memory: MemoryStore::new(),
            claims,
            writes: Duration::ZERO,
            extends: Arc::default(),
            lost: Arc::default(),
            panics: Arc::default(),
        }
    }
    fn writes(mut self, writes: Duration) -> Self {
        self.writes = writes;
        self
    }
    fn write<T: Send + Unpin + 'static>(&self, now: Result<T, StoreError>) -> Boxed<T> {
        if self.writes.is_zero() {
            return Box::pin(std::future::ready(now));
        }
        answer(Claims::Delay(self.writes.as_millis() as u64), now, false)
    }
}

fn take(counter: &AtomicUsize) -> bool {
    counter
        .fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1))
        .is_ok()
}

impl IdempotencyStore for Store {
    type ClaimFuture = Boxed<ClaimOutcome>;
    type CompleteFuture = Boxed<bool>;
    type ReleaseFuture = Boxed<bool>;
    type ExtendFuture = Boxed<bool>;

    fn claim(
        &self,
        key: StoreKey,
        token: ClaimToken,
        fp: Fingerprint,
        lease: Duration,
    ) -> Self::ClaimFuture {
        let landed = self.memory.claim(key, token, fp, lease).now_or_never();
        let landed = landed.expect("the memory store answers at once");
        if take(&self.lost) {
            return answer(self.claims, Err(StoreError::timeout()), false);
        }
        let panic = take(&self.panics);
        answer(self.claims, landed, panic)
    }
    fn complete(
        &self,
        key: StoreKey,
        token: ClaimToken,
        c: Completion,
        r: Duration,
    ) -> Self::CompleteFuture {
        // Takes effect when the write arrives, that is when it answers.
        let (memory, writes) = (self.memory.clone(), self.writes);
        Box::pin(async move {
            tokio::time::sleep(writes).await;
            memory.complete(key, token, c, r).await
        })
    }
    fn release(&self, key: StoreKey, token: ClaimToken) -> Self::ReleaseFuture {
        let (memory, writes) = (self.memory.clone(), self.writes);
        Box::pin(async move {
            tokio::time::sleep(writes).await;
            memory.release(key, token).await
        })
    }
    fn extend(&self, key: StoreKey, token: ClaimToken, lease: Duration) -> Self::ExtendFuture {
        self.extends.fetch_add(1, SeqCst);
        let now = self
            .memory
            .extend(key, token, lease)
            .now_or_never()
            .unwrap();
        self.write(now)
    }
}

/// Lets spawned work (background releases, detached handlers) run, without moving the clock.
async fn settle() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn dropped_at_any_poll_while_claiming_never_holds_the_key_nor_runs_twice() {
    for claims in MODES {
        for cancel in [false, true] {
            for polls in 0..6 {
                let case = format!("{claims:?}, cancel {cancel}, dropped after {polls} polls");
                let store = Store::new(claims);
                let handler = Handler::default();
                let svc = IdempotencyLayer::with_store(store.clone())
                    .cancel_on_disconnect(cancel)
                    .layer(handler.clone());
                let mut pending = Box::pin(svc.clone().oneshot(post(
                    "/c?sleep_ms=1000",
                    Some("k"),
                    "x",
                )));
                for _ in 0..polls {
                    assert!(futures_util::poll!(pending.as_mut()).is_pending(), "{case}");
                    tokio::time::advance(Duration::from_millis(40)).await;
                }
                drop(pending); // the client went away
                tokio::time::advance(Duration::from_millis(200)).await;
                settle().await;
                let ran = handler.runs();
                assert!(ran <= 1, "{case}: ran {ran} times");
                if ran == 0 || cancel {
                    assert!(
                        store.memory.is_empty(),
                        "{case}: a claim that landed after (or whose handler was cancelled \
                         by) the drop is released, not held for a lease"
                    );
                    let retry = send(&svc, post("/c?sleep_ms=1000", Some("k"), "x")).await;
                    assert_eq!(retry.status, StatusCode::CREATED, "{case}: no 409");
                    assert!(!retry.replayed(), "{case}");
                    assert_eq!(handler.runs(), ran + 1, "{case}");
                } else {
                    // The handler finishes on its own task and its response is stored.
                    let early = send(&svc, post("/c?sleep_ms=1000", Some("k"), "x")).await;
                    assert_eq!(early.status, StatusCode::CONFLICT, "{case}: still running");
                    tokio::time::advance(Duration::from_millis(1100)).await;
                    settle().await;
                    let retry = send(&svc, post("/c?sleep_ms=1000", Some("k"), "x")).await;
                    assert!(retry.replayed(), "{case}: the detached run was stored");
                    assert_eq!(retry.body, "run 1: x", "{case}");
                    assert_eq!(handler.runs(), 1, "{case}: the effect happened once");
                }
            }
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_claim_whose_answer_is_lost_fails_closed_with_503_and_releases_in_the_background() {
    for claims in MODES {
        let store = Store::new(claims);
        store.lost.store(1, SeqCst);
        let handler = Handler::default();
        let svc = IdempotencyLayer::with_store(store.clone())
            .unavailable_retry_after(Duration::from_secs(7))
            .layer(handler.clone());
        let refused = send(&svc, post("/c", Some("k"), "x")).await;
        assert_eq!(
            refused.status,
            StatusCode::SERVICE_UNAVAILABLE,
            "{claims:?}"
        );
        assert_eq!(refused.headers["retry-after"], "7", "{claims:?}");
        assert_eq!(handler.runs(), 0, "{claims:?}: fail-closed runs nothing");
        settle().await;
        assert!(
            store.memory.is_empty(),
            "{claims:?}: the claim that landed was released in the background"
        );
        let retry = send(&svc, post("/c", Some("k"), "x")).await;
        assert_eq!(retry.status, StatusCode::CREATED, "{claims:?}: no 409");
        assert_eq!(handler.runs(), 1, "{claims:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_claim_whose_answer_is_lost_fails_open_without_a_claim_and_releases() {
    for claims in MODES {
        let store = Store::new(claims);
        store.lost.store(1, SeqCst);
        let handler = Handler::default();
        let svc = IdempotencyLayer::with_store(store.clone())
            .fail_open(true)
            .layer(handler.clone());
        let ran = send(&svc, post("/c", Some("k"), "x")).await;
        assert_eq!(ran.status, StatusCode::CREATED, "{claims:?}");
        assert_eq!(handler.runs(), 1, "{claims:?}: fail-open runs it");
        assert_eq!(
            handler.tokens_seen(),
            0,
            "{claims:?}: without a claim, no claim token"
        );
        settle().await;
        assert!(
            store.memory.is_empty(),
            "{claims:?}: nothing stored, the claim that landed released"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn existing_records_replay_conflict_and_mismatch_whichever_way_the_claim_answers() {
    for claims in MODES {
        let store = Store::new(claims);
        let handler = Handler::default();
        let svc = IdempotencyLayer::with_store(store.clone())
            .in_progress_retry_after(Duration::from_secs(1))
            .layer(handler.clone());
        let running = tokio::spawn({
            let svc = svc.clone();
            async move { send(&svc, post("/c?sleep_ms=5000", Some("k"), "x")).await }
        });
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(handler.runs(), 1, "{claims:?}");
        let busy = send(&svc, post("/c?sleep_ms=5000", Some("k"), "x")).await;
        assert_eq!(busy.status, StatusCode::CONFLICT, "{claims:?}");
        assert!(busy.headers.contains_key("retry-after"), "{claims:?}");
        let first = running.await.unwrap();
        assert_eq!(first.status, StatusCode::CREATED, "{claims:?}");
        let replay = send(&svc, post("/c?sleep_ms=5000", Some("k"), "x")).await;
        assert!(replay.replayed(), "{claims:?}");
        assert_eq!(replay.body, first.body, "{claims:?}");
        let other = send(&svc, post("/c?sleep_ms=5000", Some("k"), "y")).await;
        assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY, "{claims:?}");
        assert_eq!(handler.runs(), 1, "{claims:?}: the duplicates ran nothing");
    }
}

#[tokio::test(start_paused = true)]
async fn the_lease_is_renewed_whether_the_claim_answered_at_once_or_later_even_detached() {
    let lease = Duration::from_secs(3);
    for claims in MODES {
        for leave in [false, true] {
            let case = format!("{claims:?}, client leaves {leave}");
            let store = Store::new(claims);
            let handler = Handler::default();
            let svc = IdempotencyLayer::with_store(store.clone())
                .lease(lease)
                .layer(handler.clone());
            let first = tokio::spawn({
                let svc = svc.clone();
                async move { send(&svc, post("/c?sleep_ms=20000", Some("k"), "x")).await }
            });
            tokio::time::sleep(Duration::from_millis(500)).await;
            assert_eq!(handler.runs(), 1, "{case}");
            if leave {
                first.abort();
                let _ = first.await;
            }
            // Well past several leases: without renewal the key would be free by now.
            tokio::time::sleep(Duration::from_secs(15)).await;
            let dup = send(&svc, post("/c?sleep_ms=20000", Some("k"), "x")).await;
            assert_eq!(
                dup.status,
                StatusCode::CONFLICT,
                "{case}: the lease was renewed"
            );
            assert!(
                store.extends.load(SeqCst) >= 4,
                "{case}: renewed every third of the lease, got {}",
                store.extends.load(SeqCst)
            );
            tokio::time::sleep(Duration::from_secs(10)).await;
            let retry = send(&svc, post("/c?sleep_ms=20000", Some("k"), "x")).await;
            assert!(retry.replayed(), "{case}: the response was stored");
            assert_eq!(retry.body, "run 1: x", "{case}");
            assert_eq!(handler.runs(), 1, "{case}");
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_ready_claim_with_slow_writes_stores_or_releases_even_if_the_client_leaves_mid_write() {
    for claims in MODES {
        for cancel in [false, true] {
            let case = format!("{claims:?}, cancel {cancel}");
            let store = Store::new(claims).writes(Duration::from_millis(500));
            let handler = Handler::default();
            let svc = IdempotencyLayer::with_store(store.clone())
                .cancel_on_disconnect(cancel)
                .layer(handler.clone());

            // Stored: the handler answers at once, the completion is in flight, the client leaves.
            let mut pending = Box::pin(svc.clone().oneshot(post("/c", Some("k"), "x")));
            for _ in 0..4 {
                if handler.runs() == 1 {
                    break;
                }
                assert!(futures_util::poll!(pending.as_mut()).is_pending(), "{case}");
                tokio::time::advance(Duration::from_millis(50)).await;
            }
            assert_eq!(handler.runs(), 1, "{case}");
            assert!(futures_util::poll!(pending.as_mut()).is_pending(), "{case}");
            drop(pending);
            tokio::time::advance(Duration::from_millis(600)).await;
            settle().await;
            let retry = send(&svc, post("/c", Some("k"), "x")).await;
            assert!(retry.replayed(), "{case}: the completion in flight landed");
            assert_eq!(handler.runs(), 1, "{case}");

            // Released: the handler answers 500, the release is in flight, the client leaves.
            let mut pending = Box::pin(svc.clone().oneshot(post(
                "/d?status=500",
                Some("other"),
                "x",
            )));
            for _ in 0..4 {
                if handler.runs() == 2 {
                    break;
                }
                assert!(futures_util::poll!(pending.as_mut()).is_pending(), "{case}");
                tokio::time::advance(Duration::from_millis(50)).await;
            }
            assert_eq!(handler.runs(), 2, "{case}");
            assert!(futures_util::poll!(pending.as_mut()).is_pending(), "{case}");
            drop(pending);
            tokio::time::advance(Duration::from_millis(600)).await;
            settle().await;
            assert_eq!(
                store.memory.len(),
                1,
                "{case}: only the stored record is left; the release in flight landed"
            );
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_claim_future_that_panics_runs_nothing_and_frees_the_key_within_its_lease() {
    let lease = Duration::from_secs(3);
    for claims in MODES {
        let store = Store::new(claims);
        store.panics.store(1, SeqCst);
        let handler = Handler::default();
        let svc = IdempotencyLayer::with_store(store.clone())
            .lease(lease)
            .layer(handler.clone());
        let crashed = tokio::spawn({
            let svc = svc.clone();
            async move { send(&svc, post("/c", Some("k"), "x")).await }
        });
        let error = crashed
            .await
            .expect_err("the store's panic reaches the task");
        assert!(error.is_panic(), "{claims:?}");
        assert_eq!(handler.runs(), 0, "{claims:?}");
        tokio::time::advance(lease + Duration::from_millis(10)).await;
        settle().await;
        let retry = send(&svc, post("/c", Some("k"), "x")).await;
        assert_eq!(
            retry.status,
            StatusCode::CREATED,
            "{claims:?}: the key is free after one lease"
        );
        assert_eq!(handler.runs(), 1, "{claims:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn many_concurrent_duplicates_run_the_handler_once() {
    let handler = Handler::default();
    let svc = IdempotencyLayer::new().layer(handler.clone());
    let tasks: Vec<_> = (0..200)
        .map(|_| {
            let svc = svc.clone();
            tokio::spawn(async move { send(&svc, post("/c?sleep_ms=50", Some("same"), "x")).await })
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

#[tokio::test(start_paused = true)]
async fn handler_sees_its_claim_token() {
    let handler = Handler::default();
    let svc = IdempotencyLayer::new().layer(handler.clone());
    send(&svc, post("/c?status=500", Some("k"), "x")).await;
    send(&svc, post("/c", Some("k"), "x")).await;
    send(&svc, post("/c", None, "x")).await;
    let tokens = handler.tokens.lock().unwrap().clone();
    assert_eq!(
        tokens.len(),
        2,
        "keyed runs carry a token, unkeyed ones do not"
    );
    assert_ne!(tokens[0], tokens[1], "each claim has its own token");
}

#[tokio::test(start_paused = true)]
async fn the_handler_sees_the_records_key_the_same_for_the_same_request() {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let s = seen.clone();
    let svc = IdempotencyLayer::new().layer(tower::service_fn(move |req: Req| {
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
    send(&svc, post("/charge", Some("k1"), "{}")).await;
    send(&svc, post("/charge", Some("k1"), "{}")).await;
    send(&svc, post("/charge", Some("k2"), "{}")).await;
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

/// A memory store whose claims answer after 100 ms, like a store across a network: the claim
/// takes effect when it arrives; the answer is what is in flight.
#[derive(Clone)]
struct SlowClaims(MemoryStore);

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

    let retry = send(&svc, post("/c", Some("k"), "x")).await;
    assert_eq!(
        retry.status,
        StatusCode::CREATED,
        "the retry runs at once, no 409"
    );
    assert_eq!(handler.runs(), 1);
}
