//! Run a job's effect once per job id, on any [`IdempotencyStore`].
//!
//! Streams deliver at least once: a worker that dies after the effect but before `XACK` has its
//! entry redelivered, and a producer retried by its caller enqueues the same job id twice.
//! [`RunOnceLayer`] claims the job id in the store before the handler runs:
//!
//! | the store has the job id | the layer | the worker then |
//! |---|---|---|
//! | nothing (or an expired claim) | claims it, runs the handler; `Ok` → records it done, `Err` → releases the claim | acts on the handler's outcome |
//! | done | returns [`RunOnceOutcome::Duplicate`], the handler does not run | `XACK` |
//! | in progress (another delivery is running it) | returns an error that [`is_in_progress`](RunOnceError::is_in_progress) | leaves it pending (transient) |
//! | store unreachable | returns an error that [`is_store`](RunOnceError::is_store) | leaves it pending (transient) |
//!
//! While the handler runs, the claim's lease is renewed every third of it, so a slow handler
//! keeps it and a dead worker's claim expires within one lease. The record is kept for the
//! retention period (default 24 h): a duplicate arriving later runs again.
//!
//! # What it cannot do
//!
//! The effect and the "done" record are two writes. A worker that dies between them leaves
//! the claim in progress; once its lease expires the job runs again. Where that window
//! matters, make the effect itself idempotent (write it, keyed by the job id, in the same
//! transaction as your data: the outbox pattern).

use crate::job::{Job, JobId};
use bytes::Bytes;
use pin_project_lite::pin_project;
use sha2::{Digest, Sha256};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::time::{Instant, Sleep};
use tower_layer::Layer;
use tower_once_idempotency::fingerprint::Fingerprint;
use tower_once_idempotency::store::{
    ClaimOutcome, ClaimToken, Completion, IdempotencyStore, RecordState, StoreError, StoreKey,
    StoredResponse,
};
use tower_service::Service;

/// Default lease of a run-once claim.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// Default retention of a "done" record.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(24 * 3600);

/// The store key of a job id: SHA-256 over a fixed prefix and the id, so job records never
/// collide with the HTTP idempotency records in the same store.
pub fn job_store_key(job_id: &JobId) -> StoreKey {
    let mut hasher = Sha256::new();
    hasher.update(b"tower-once/job/v1\0");
    hasher.update(job_id.as_str().as_bytes());
    StoreKey::from_bytes(hasher.finalize().into())
}

/// Wraps a handler so each job id's effect runs once. See the [module docs](self).
///
/// ```
/// use tower::{Layer, ServiceExt};
/// use tower_once_idempotency::store::MemoryStore;
/// use tower_once_worker::{Job, JobError, JobId, RunOnceLayer};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let layer = RunOnceLayer::new(MemoryStore::new());
/// let handler = tower::service_fn(|_job: Job| async { Ok::<_, JobError>("sent") });
/// let job = Job::new("1-0", JobId::new("welcome-mail-7").unwrap(), "{}", 1);
/// let first = layer.layer(handler).oneshot(job.clone()).await.unwrap();
/// assert!(!first.is_duplicate());
/// let again = layer.layer(handler).oneshot(job).await.unwrap();
/// assert!(again.is_duplicate()); // the handler did not run
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct RunOnceLayer<St> {
    store: St,
    lease: Duration,
    retention: Duration,
}

impl<St> RunOnceLayer<St> {
    /// Run-once on `store`, with a 30 s lease and 24 h retention.
    pub const fn new(store: St) -> Self {
        Self {
            store,
            lease: DEFAULT_LEASE,
            retention: DEFAULT_RETENTION,
        }
    }

    /// How long a claim lives without renewal; renewed every third of it while the handler
    /// runs. A delivery arriving while a dead worker's claim is unexpired is left pending.
    ///
    /// # Panics
    ///
    /// If `lease` is under 3 ms.
    pub fn lease(mut self, lease: Duration) -> Self {
        assert!(
            lease >= Duration::from_millis(3),
            "RunOnceLayer::lease must be at least 3 ms"
        );
        self.lease = lease;
        self
    }

    /// How long a "done" record is kept (duplicates within it are acknowledged unrun).
    ///
    /// # Panics
    ///
    /// If `retention` is zero.
    pub fn retention(mut self, retention: Duration) -> Self {
        assert!(
            !retention.is_zero(),
            "RunOnceLayer::retention must not be zero"
        );
        self.retention = retention;
        self
    }
}

impl<S, St: Clone> Layer<S> for RunOnceLayer<St> {
    type Service = RunOnce<S, St>;

    fn layer(&self, inner: S) -> Self::Service {
        RunOnce {
            inner,
            store: self.store.clone(),
            lease: self.lease,
            retention: self.retention,
        }
    }
}

/// The service of [`RunOnceLayer`].
#[derive(Debug, Clone)]
pub struct RunOnce<S, St> {
    inner: S,
    store: St,
    lease: Duration,
    retention: Duration,
}

impl<S, St> Service<Job> for RunOnce<S, St>
where
    S: Service<Job> + Clone,
    St: IdempotencyStore,
{
    type Response = RunOnceOutcome<S::Response>;
    type Error = RunOnceError<S::Error>;
    type Future = ResponseFuture<S, St>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(RunOnceError::inner)
    }

    fn call(&mut self, job: Job) -> Self::Future {
        // The ready service goes into the future; the clone stays for the next poll_ready.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let key = job_store_key(job.job_id());
        let token = ClaimToken::new();
        let claim = self.store.claim(
            key,
            token,
            Fingerprint::from_bytes(*key.as_bytes()),
            self.lease,
        );
        ResponseFuture {
            store: self.store.clone(),
            key,
            token,
            lease: self.lease,
            retention: self.retention,
            state: State::Claiming {
                claim,
                inner: Some((inner, job)),
            },
        }
    }
}

/// How a job went through [`RunOnce`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunOnceOutcome<R> {
    /// The handler ran (this delivery) and returned this.
    Done(R),
    /// The job id's effect was already done; the handler did not run.
    Duplicate,
}

impl<R> RunOnceOutcome<R> {
    /// Whether the handler was skipped as a duplicate.
    pub fn is_duplicate(&self) -> bool {
        matches!(self, Self::Duplicate)
    }

    /// The handler's response, if it ran.
    pub fn into_response(self) -> Option<R> {
        match self {
            Self::Done(r) => Some(r),
            Self::Duplicate => None,
        }
    }

    /// A stable name for logs: `done` or `duplicate`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Done(_) => "done",
            Self::Duplicate => "duplicate",
        }
    }
}

/// Why [`RunOnce`] returned no outcome: the handler's error, a concurrent delivery, or the
/// store.
#[derive(Debug)]
pub struct RunOnceError<E>(Repr<E>);

#[derive(Debug)]
enum Repr<E> {
    Inner(E),
    InProgress,
    Store(StoreError),
}

impl<E> RunOnceError<E> {
    pub(crate) fn inner(e: E) -> Self {
        Self(Repr::Inner(e))
    }

    #[cfg(test)]
    pub(crate) fn in_progress() -> Self {
        Self(Repr::InProgress)
    }

    /// The handler ran and failed (its claim was released, so a redelivery runs it again).
    pub fn is_inner(&self) -> bool {
        matches!(self.0, Repr::Inner(_))
    }

    /// Another delivery of the same job id holds the claim; the handler did not run.
    pub fn is_in_progress(&self) -> bool {
        matches!(self.0, Repr::InProgress)
    }

    /// The store failed; the handler did not run.
    pub fn is_store(&self) -> bool {
        matches!(self.0, Repr::Store(_))
    }

    /// The handler's error.
    pub fn get_inner(&self) -> Option<&E> {
        match &self.0 {
            Repr::Inner(e) => Some(e),
            _ => None,
        }
    }

    /// The handler's error, consuming this one.
    pub fn into_inner(self) -> Option<E> {
        match self.0 {
            Repr::Inner(e) => Some(e),
            _ => None,
        }
    }
}

impl<E: fmt::Display> fmt::Display for RunOnceError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Repr::Inner(e) => fmt::Display::fmt(e, f),
            Repr::InProgress => f.write_str("another delivery of this job id is running"),
            Repr::Store(e) => write!(f, "run-once store: {e}"),
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for RunOnceError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.0 {
            Repr::Inner(e) => Some(e),
            Repr::InProgress => None,
            Repr::Store(e) => Some(e),
        }
    }
}

pin_project! {
    /// The future of [`RunOnce`]: claim, run (renewing the lease), then complete or release.
    pub struct ResponseFuture<S, St>
    where
        S: Service<Job>,
        St: IdempotencyStore,
    {
        store: St,
        key: StoreKey,
        token: ClaimToken,
        lease: Duration,
        retention: Duration,
        #[pin]
        state: State<S, St>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, St>
    where
        S: Service<Job>,
        St: IdempotencyStore,
    {
        Claiming { claim: St::ClaimFuture, inner: Option<(S, Job)> },
        Running {
            #[pin]
            future: S::Future,
            #[pin]
            renew_at: Sleep,
            extend: Option<St::ExtendFuture>,
        },
        Completing { complete: St::CompleteFuture, response: Option<S::Response> },
        Releasing { release: St::ReleaseFuture, error: Option<S::Error> },
    }
}

impl<S: Service<Job>, St: IdempotencyStore> fmt::Debug for ResponseFuture<S, St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Claiming { .. } => "claiming",
            State::Running { .. } => "running",
            State::Completing { .. } => "completing",
            State::Releasing { .. } => "releasing",
        };
        f.debug_struct("ResponseFuture")
            .field("key", &self.key)
            .field("state", &state)
            .finish()
    }
}

type Output<S> =
    Result<RunOnceOutcome<<S as Service<Job>>::Response>, RunOnceError<<S as Service<Job>>::Error>>;

impl<S, St> Future for ResponseFuture<S, St>
where
    S: Service<Job>,
    St: IdempotencyStore,
{
    type Output = Output<S>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            let next = match this.state.as_mut().project() {
                StateProj::Claiming { claim, inner } => {
                    let claimed = ready!(Pin::new(claim).poll(cx));
                    match start(claimed, inner, *this.lease) {
                        Ok(state) => state,
                        Err(output) => return Poll::Ready(output),
                    }
                }
                StateProj::Running {
                    future,
                    renew_at,
                    extend,
                } => {
                    let renewal = Renewal {
                        store: this.store,
                        key: *this.key,
                        token: *this.token,
                        lease: *this.lease,
                    };
                    renewal.poll(cx, renew_at, extend);
                    let result = ready!(future.poll(cx));
                    finish(result, this.store, *this.key, *this.token, *this.retention)
                }
                StateProj::Completing { complete, response } => {
                    let stored = ready!(Pin::new(complete).poll(cx));
                    if !matches!(stored, Ok(true)) {
                        // The effect happened; only the record of it is missing. Acknowledge.
                        tracing::warn!(key = %this.key, ?stored, "run-once: could not record the job as done");
                    }
                    return Poll::Ready(match response.take() {
                        Some(r) => Ok(RunOnceOutcome::Done(r)),
                        None => Err(RunOnceError(Repr::Store(StoreError::corrupt(
                            "polled after completion",
                        )))),
                    });
                }
                StateProj::Releasing { release, error } => {
                    let _ = ready!(Pin::new(release).poll(cx));
                    return Poll::Ready(match error.take() {
                        Some(e) => Err(RunOnceError::inner(e)),
                        None => Err(RunOnceError(Repr::Store(StoreError::corrupt(
                            "polled after completion",
                        )))),
                    });
                }
            };
            this.state.set(next);
        }
    }
}

/// After the claim: run the handler, or answer without it.
fn start<S, St>(
    claimed: Result<ClaimOutcome, StoreError>,
    inner: &mut Option<(S, Job)>,
    lease: Duration,
) -> Result<State<S, St>, Output<S>>
where
    S: Service<Job>,
    St: IdempotencyStore,
{
    match claimed {
        Ok(ClaimOutcome::Claimed) => {}
        Ok(ClaimOutcome::Existing(record)) => {
            return Err(match record.state {
                RecordState::InProgress { .. } => Err(RunOnceError(Repr::InProgress)),
                RecordState::Completed(_) | RecordState::NotReplayable => {
                    Ok(RunOnceOutcome::Duplicate)
                }
            })
        }
        Err(e) => return Err(Err(RunOnceError(Repr::Store(e)))),
    }
    let Some((mut service, job)) = inner.take() else {
        return Err(Err(RunOnceError(Repr::Store(StoreError::corrupt(
            "polled after completion",
        )))));
    };
    // The handler is called after the claim, outside the worker's `call`: put the delivery's
    // deadline back in scope so a `TimeoutLayer`/`RetryLayer` inside still sees it.
    let future = match job.deadline() {
        Some(deadline) => deadline.scope(|| service.call(job)),
        None => service.call(job),
    };
    Ok(State::Running {
        future,
        renew_at: tokio::time::sleep(lease / 3),
        extend: None,
    })
}

/// After the handler: record the job done, or release the claim so a redelivery runs it.
fn finish<S, St>(
    result: Result<S::Response, S::Error>,
    store: &St,
    key: StoreKey,
    token: ClaimToken,
    retention: Duration,
) -> State<S, St>
where
    S: Service<Job>,
    St: IdempotencyStore,
{
    match result {
        Ok(response) => {
            let done =
                StoredResponse::new(http::StatusCode::OK, http::HeaderMap::new(), Bytes::new());
            State::Completing {
                complete: store.complete(key, token, Completion::Response(done), retention),
                response: Some(response),
            }
        }
        Err(error) => State::Releasing {
            release: store.release(key, token),
            error: Some(error),
        },
    }
}

/// Renews the claim's lease every third of it while the handler runs.
struct Renewal<'a, St> {
    store: &'a St,
    key: StoreKey,
    token: ClaimToken,
    lease: Duration,
}

impl<St: IdempotencyStore> Renewal<'_, St> {
    fn poll(
        &self,
        cx: &mut Context<'_>,
        mut renew_at: Pin<&mut Sleep>,
        extend: &mut Option<St::ExtendFuture>,
    ) {
        // At most two rounds: finish a pending renewal, then start (and poll) the next one.
        for _ in 0..2 {
            if let Some(pending) = extend {
                match Pin::new(pending).poll(cx) {
                    Poll::Pending => return,
                    Poll::Ready(Ok(true)) => {}
                    Poll::Ready(other) => {
                        tracing::warn!(key = %self.key, ?other, "run-once: lease renewal failed");
                    }
                }
                *extend = None;
            }
            if renew_at.as_mut().poll(cx).is_pending() {
                return;
            }
            renew_at.as_mut().reset(Instant::now() + self.lease / 3);
            *extend = Some(self.store.extend(self.key, self.token, self.lease));
        }
    }
}
