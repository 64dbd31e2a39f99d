//! Fixtures shared by the step tests: a tool that counts its calls, requests, the keys the
//! layer derives (to claim a step's record from "another process"), a store whose replies are
//! slow, and ways to stop a step mid-call (drop it, or forget it as a killed process does).
#![allow(dead_code, unreachable_pub)]

#[cfg(feature = "postgres")]
pub mod postgres;

use sha2::{Digest, Sha256};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;
use tower::Service;
use tower_once_idempotency::fingerprint::Fingerprint;
use tower_once_idempotency::store::{
    ClaimOutcome, ClaimToken, Completion, IdempotencyStore, MemoryStore, StoreFuture, StoreKey,
};
use tower_once_step::{StepId, StepRequest};

/// A refunds tool, as the fixtures below return it: answers `Refund`, fails with an I/O error,
/// its futures `Send`.
pub trait RefundTool<Req>:
    Service<Req, Response = Refund, Error = std::io::Error, Future: Send> + Clone + Send
{
}

impl<Req, S> RefundTool<Req> for S
where
    S: Service<Req, Response = Refund, Error = std::io::Error> + Clone + Send,
    S::Future: Send,
{
}

/// How many times a tool was called.
pub type Calls = Arc<AtomicUsize>;
/// The `Idempotency-Key` each call of a tool carried (`None`: no key).
pub type Keys = Arc<std::sync::Mutex<Vec<Option<String>>>>;

/// A tool's result, as a tool returns JSON.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Refund {
    pub status: u16,
    /// Which call of the tool produced it (0 for the first).
    pub call: usize,
}

/// A tool: `f(request, n)` for its `n`th call (from 0). The count goes up when the tool is
/// *called* (the request is sent), before its future runs.
pub fn tool<Req, T, E, F, Fut>(
    f: F,
) -> (
    Arc<AtomicUsize>,
    impl Service<Req, Response = T, Error = E, Future = Fut> + Clone + Send + 'static,
)
where
    F: Fn(Req, usize) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<T, E>> + Send + 'static,
{
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&calls);
    let svc = tower::service_fn(move |req| {
        let n = counted.fetch_add(1, SeqCst);
        f(req, n)
    });
    (calls, svc)
}

/// A refunds tool answering `201` at once.
pub fn refunds<Req: Send + 'static>() -> (Calls, impl RefundTool<Req>) {
    tool(|_req: Req, call| async move { Ok(Refund { status: 201, call }) })
}

/// A refunds tool whose calls take `delay` (on tokio's clock).
pub fn slow_refunds<Req: Send + 'static>(delay: Duration) -> (Calls, impl RefundTool<Req>) {
    tool(move |_req: Req, call| async move {
        tokio::time::sleep(delay).await;
        Ok(Refund { status: 201, call })
    })
}

/// A refunds tool whose first `hanging` calls never answer (a killed process's, say) and whose
/// later calls answer `201` at once.
pub fn first_calls_hang<Req: Send + 'static>(hanging: usize) -> (Calls, impl RefundTool<Req>) {
    tool(move |_: Req, call| async move {
        if call < hanging {
            std::future::pending::<()>().await;
        }
        Ok(Refund { status: 201, call })
    })
}

/// A refunds tool whose every call fails at once with a timeout (sent, its outcome unknown).
pub fn timing_out<Req: Send + 'static>() -> (Calls, impl RefundTool<Req>) {
    tool(
        |_: Req, _| async move { Err::<Refund, _>(std::io::Error::from(std::io::ErrorKind::TimedOut)) },
    )
}

/// A tool that keeps the `Idempotency-Key` of every call (when it is called, before its
/// future runs), then answers `f(n)` for its `n`th call (from 0).
pub fn keeping_keys<F, Fut>(f: F) -> (Calls, Keys, impl RefundTool<http::Request<String>>)
where
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<Refund, std::io::Error>> + Send + 'static,
{
    let keys = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = Arc::clone(&keys);
    let (calls, svc) = tool(move |req: http::Request<String>, call| {
        seen.lock().unwrap().push(
            req.headers()
                .get("idempotency-key")
                .map(|v| v.to_str().unwrap().to_owned()),
        );
        f(call)
    });
    (calls, keys, svc)
}

/// A refunds tool whose calls never answer (the call is sent, the answer never comes).
pub fn hanging_refunds<Req: Send + 'static>() -> (Calls, impl RefundTool<Req>) {
    tool(|_req: Req, _call| async move {
        std::future::pending::<()>().await;
        Ok(Refund {
            status: 201,
            call: usize::MAX,
        })
    })
}

/// `POST /refunds` without a key: not idempotent, so an unkeyed step's policy is `Refuse`.
pub fn post(body: &str) -> http::Request<String> {
    http::Request::post("http://payments/refunds")
        .body(body.to_string())
        .unwrap()
}

/// `GET /orders`: idempotent, so the step's policy is `RunAgain`.
pub fn get() -> http::Request<String> {
    http::Request::get("http://orders/orders/A7")
        .body(String::new())
        .unwrap()
}

/// The step most tests run: run-1's second step, calling the `refund` tool.
pub fn refund_id() -> StepId {
    StepId::new("run-1", 2, "refund")
}

/// A request type of the caller's own: no extensions, never sent twice unless the step says so.
#[derive(Debug, Clone)]
pub struct Lookup(pub &'static str);

impl StepRequest for Lookup {}

/// Lets tasks spawned by a dropped step (its release, its unknown record) run.
pub async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

/// Polls `future` for `for_` (tokio's clock), then forgets it without dropping it: what a
/// killed process leaves behind (no release, no renewal, nothing spawned).
pub async fn kill_after<F: Future>(future: F, for_: Duration) {
    let mut future = Box::pin(future);
    let early = tokio::time::timeout(for_, future.as_mut()).await;
    assert!(
        early.is_err(),
        "the step finished before it could be killed"
    );
    std::mem::forget(future);
}

// ---- The keys the layer derives, computed here as another process would. ----

/// The store key of a step's record (what the layer claims), within `scope`.
pub fn record_key(id: &StepId, scope: &[u8]) -> StoreKey {
    scoped(id, b"tower-once/step/v1", scope)
}

/// The store key of a step's "sent" mark, within `scope`.
pub fn marker_key(id: &StepId, scope: &[u8]) -> StoreKey {
    scoped(id, b"tower-once/step-sent/v1", scope)
}

/// The fingerprint a step records for `arguments`.
pub fn arguments(bytes: &[u8]) -> Fingerprint {
    let mut out = [0; 32];
    out[..16].copy_from_slice(b"tower-once step\x01");
    out[16..].copy_from_slice(&xxhash_rust::xxh3::xxh3_128(bytes).to_be_bytes());
    Fingerprint::from_bytes(out)
}

/// The fingerprint of a step without arguments.
pub fn no_arguments() -> Fingerprint {
    Fingerprint::from_bytes([0; 32])
}

/// A "sent" mark's fingerprint, as the layer writes it before an unkeyed call.
pub fn sent_mark(at: std::time::SystemTime) -> Fingerprint {
    let ms = at
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let mut out = [0; 32];
    out[..16].copy_from_slice(b"tower-once sent\x01");
    out[16..24].copy_from_slice(&ms.to_be_bytes());
    Fingerprint::from_bytes(out)
}

/// The layer's derivation, written out (it is what stored records are found by, so it must not
/// drift): one SHA-256 over the domain, the framed scope and the framed id.
fn scoped(id: &StepId, domain: &[u8], scope: &[u8]) -> StoreKey {
    let mut hasher = Sha256::new();
    hasher.update(domain);
    framed(&mut hasher, scope);
    framed(&mut hasher, id.run().as_bytes());
    hasher.update(id.step().to_be_bytes());
    framed(&mut hasher, id.tool().as_bytes());
    hasher.update(id.occurrence_number().to_be_bytes());
    StoreKey::from_bytes(hasher.finalize().into()).with_scope(scope)
}

fn framed(hasher: &mut Sha256, bytes: &[u8]) {
    hasher.update((bytes.len() as u64).to_be_bytes());
    hasher.update(bytes);
}

/// Claims `key` for a token of "another process", which then dies holding it.
pub async fn claim_as_another<St: IdempotencyStore>(
    store: &St,
    key: StoreKey,
    fingerprint: Fingerprint,
    lease: Duration,
) -> ClaimToken {
    let token = ClaimToken::new();
    let outcome = store.claim(key, token, fingerprint, lease).await.unwrap();
    assert!(matches!(outcome, ClaimOutcome::Claimed), "the key was free");
    token
}

// ---- A store whose replies are slow. ----

/// Which claims a [`SlowReplies`] store answers late.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Late {
    /// None: a plain memory store.
    Nothing,
    /// Claims of a step's record.
    RecordClaims,
    /// Claims of a step's "sent" mark.
    MarkClaims,
    /// Completions (a step's result, or its unknown outcome): each takes effect `delay` after
    /// its future is first polled, as a write behind a pool's busy connection does (the
    /// Postgres store's futures acquire a connection first), and never if the future is
    /// dropped before. The store contract asks the layer to finish what it drops.
    Completions,
}

/// A memory store behind a slow network: each claim takes effect when it is first polled (as
/// a command reaches Redis), and its reply comes `delay` later (tokio's clock) for the claims
/// chosen with [`late`](Self::late). The store contract allows it ("an operation may take
/// effect when its method is called or when its future is first polled").
#[derive(Clone)]
pub struct SlowReplies {
    pub inner: MemoryStore,
    delay: Duration,
    late: Arc<std::sync::Mutex<Late>>,
    /// Set once a late claim has taken effect (its reply still on the way), or a late
    /// completion has.
    pub landed: Arc<AtomicBool>,
}

impl SlowReplies {
    pub fn new(delay: Duration) -> Self {
        Self {
            inner: MemoryStore::new(),
            delay,
            late: Arc::new(std::sync::Mutex::new(Late::Nothing)),
            landed: Arc::new(AtomicBool::new(false)),
        }
    }

    pub fn late(&self, which: Late) {
        *self.late.lock().unwrap() = which;
    }
}

fn is_mark(fingerprint: &Fingerprint) -> bool {
    fingerprint.as_bytes()[..16] == *b"tower-once sent\x01"
}

impl IdempotencyStore for SlowReplies {
    type ClaimFuture = StoreFuture<ClaimOutcome>;
    type CompleteFuture = StoreFuture<bool>;
    type ReleaseFuture = <MemoryStore as IdempotencyStore>::ReleaseFuture;
    type ExtendFuture = <MemoryStore as IdempotencyStore>::ExtendFuture;

    fn claim(
        &self,
        key: StoreKey,
        token: ClaimToken,
        fingerprint: Fingerprint,
        lease: Duration,
    ) -> Self::ClaimFuture {
        let late = match *self.late.lock().unwrap() {
            Late::Nothing | Late::Completions => false,
            Late::RecordClaims => !is_mark(&fingerprint),
            Late::MarkClaims => is_mark(&fingerprint),
        };
        let claim = self.inner.claim(key, token, fingerprint, lease);
        let (delay, landed) = (self.delay, Arc::clone(&self.landed));
        Box::pin(async move {
            let outcome = claim.await;
            if late {
                landed.store(true, SeqCst);
                tokio::time::sleep(delay).await;
            }
            outcome
        }) as Pin<Box<dyn Future<Output = _> + Send>>
    }

    fn complete(
        &self,
        key: StoreKey,
        token: ClaimToken,
        completion: Completion,
        retention: Duration,
    ) -> Self::CompleteFuture {
        let late = *self.late.lock().unwrap() == Late::Completions;
        let (inner, delay, landed) = (self.inner.clone(), self.delay, Arc::clone(&self.landed));
        Box::pin(async move {
            if late {
                tokio::time::sleep(delay).await;
                landed.store(true, SeqCst);
            }
            inner.complete(key, token, completion, retention).await
        })
    }

    fn release(&self, key: StoreKey, token: ClaimToken) -> Self::ReleaseFuture {
        self.inner.release(key, token)
    }

    fn extend(&self, key: StoreKey, token: ClaimToken, lease: Duration) -> Self::ExtendFuture {
        self.inner.extend(key, token, lease)
    }
}
