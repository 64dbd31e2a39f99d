//! The future of [`RunOnce`](super::RunOnce): claim, run (renewing the lease), then complete or
//! release.

use super::error::{Repr, RunOnceError};
use super::identity::entry_fingerprint;
use super::outcome::RunOnceOutcome;
use crate::job::Job;
use bytes::Bytes;
use pin_project_lite::pin_project;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::time::Sleep;
use tower_once_idempotency::store::{
    ClaimOutcome, ClaimToken, Completion, IdempotencyStore, Lease, RecordState, StoreError,
    StoreFuture, StoreKey, StoredResponse,
};
use tower_once_idempotency::{Claim, JobRecord, Settled};
use tower_service::Service;

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

    impl<S, St> PinnedDrop for ResponseFuture<S, St>
    where
        S: Service<Job>,
        St: IdempotencyStore,
    {
        // NOTE: dropped while the handler runs (a panic, a deadline, a shutdown that cancels):
        // the claim is released at once (fenced by its token, so a record that committed
        // stays), rather than held until its lease runs out.
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if !matches!(*this.state, State::Running { .. } | State::Checking { .. }) {
                return;
            }
            let Ok(runtime) = tokio::runtime::Handle::try_current() else {
                return;
            };
            let release = this.store.release(*this.key, *this.token);
            runtime.spawn(async move {
                if let Err(error) = release.await {
                    tracing::warn!(%error, "run-once: could not release the claim of a dropped run; it frees itself when its lease ends");
                }
            });
        }
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
            lease: Lease<St>,
            // Where the handler leaves the check of the record it wrote in its own transaction.
            completed: Option<JobRecord>,
        },
        // The handler wrote the record in its own transaction: did that commit it?
        Checking { check: StoreFuture<Settled>, response: Option<S::Response> },
        // The handler returned `Ok`, but its transaction rolled back, its effects and the
        // record with them: the claim is released and the delivery left to run again.
        Abandoning { release: St::ReleaseFuture },
        Completing { complete: St::CompleteFuture, response: Option<S::Response> },
        Releasing { release: St::ReleaseFuture, error: Option<S::Error> },
        // Answered.
        Done,
    }
}

impl<S: Service<Job>, St: IdempotencyStore> ResponseFuture<S, St> {
    pub(super) fn new(
        store: St,
        (key, token): (StoreKey, ClaimToken),
        (lease, retention): (Duration, Duration),
        claim: St::ClaimFuture,
        inner: (S, Job),
    ) -> Self {
        Self {
            store,
            key,
            token,
            lease,
            retention,
            state: State::Claiming {
                claim,
                inner: Some(inner),
            },
        }
    }
}

impl<S: Service<Job>, St: IdempotencyStore> fmt::Debug for ResponseFuture<S, St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Claiming { .. } => "claiming",
            State::Running { .. } => "running",
            State::Checking { .. } => "checking",
            State::Abandoning { .. } => "abandoning",
            State::Completing { .. } => "completing",
            State::Releasing { .. } => "releasing",
            State::Done => "done",
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
                    let lease = Lease::new(this.store.clone(), *this.key, *this.token, *this.lease);
                    match start(claimed, inner, lease, *this.retention) {
                        Ok(state) => state,
                        Err(output) => return Poll::Ready(output),
                    }
                }
                StateProj::Running {
                    future,
                    renew_at,
                    lease,
                    completed,
                } => {
                    let Poll::Ready(result) = future.poll(cx) else {
                        lease.poll_renew(renew_at, cx);
                        return Poll::Pending;
                    };
                    // NOTE: the handler wrote the record in its own transaction; the layer reads
                    // the record (did that transaction commit it?), never trusting the mark.
                    match (result, completed.as_ref().and_then(JobRecord::check)) {
                        (Ok(response), Some(check)) => State::Checking {
                            check,
                            response: Some(response),
                        },
                        (result, _) => {
                            finish(result, this.store, *this.key, *this.token, *this.retention)
                        }
                    }
                }
                StateProj::Checking { check, response } => {
                    let settled = ready!(check.as_mut().poll(cx));
                    let Some(response) = response.take() else {
                        tower_once_core::polled_after_completion("ResponseFuture")
                    };
                    match settled {
                        Ok(Settled::Store) => finish(
                            Ok(response),
                            this.store,
                            *this.key,
                            *this.token,
                            *this.retention,
                        ),
                        Ok(Settled::Release) => State::Abandoning {
                            release: this.store.release(*this.key, *this.token),
                        },
                        Ok(Settled::Done) => {
                            this.state.set(State::Done);
                            return Poll::Ready(Ok(RunOnceOutcome::Done(response)));
                        }
                        Err(error) => {
                            // Unknown: the record may have committed with the effects. As
                            // before the check, the handler's word stands.
                            tracing::warn!(key = %this.key, %error, "run-once: could not read the record the handler wrote; acknowledging");
                            this.state.set(State::Done);
                            return Poll::Ready(Ok(RunOnceOutcome::Done(response)));
                        }
                    }
                }
                StateProj::Abandoning { release } => {
                    let _ = ready!(Pin::new(release).poll(cx));
                    return Poll::Ready(Err(RunOnceError(Repr::RolledBack)));
                }
                StateProj::Completing { complete, response } => {
                    let stored = ready!(Pin::new(complete).poll(cx));
                    if !matches!(stored, Ok(true)) {
                        // The effect happened; only the record of it is missing. Acknowledge.
                        tracing::warn!(key = %this.key, ?stored, "run-once: could not record the job as done");
                    }
                    return Poll::Ready(match response.take() {
                        Some(r) => Ok(RunOnceOutcome::Done(r)),
                        None => tower_once_core::polled_after_completion("ResponseFuture"),
                    });
                }
                StateProj::Done => tower_once_core::polled_after_completion("ResponseFuture"),
                StateProj::Releasing { release, error } => {
                    let _ = ready!(Pin::new(release).poll(cx));
                    return Poll::Ready(match error.take() {
                        Some(e) => Err(RunOnceError::inner(e)),
                        None => tower_once_core::polled_after_completion("ResponseFuture"),
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
    lease: Lease<St>,
    retention: Duration,
) -> Result<State<S, St>, Output<S>>
where
    S: Service<Job>,
    St: IdempotencyStore,
{
    match claimed {
        Ok(ClaimOutcome::Claimed) => {}
        Ok(ClaimOutcome::Existing(record)) => {
            let same_entry = inner
                .as_ref()
                .is_some_and(|(_, job)| record.fingerprint == entry_fingerprint(job.stream_id()));
            return Err(match record.state {
                // This very entry is running elsewhere (taken over while alive): leave it.
                RecordState::InProgress { .. } if same_entry => Err(RunOnceError(Repr::InProgress)),
                // Another entry with this job id is running: it stays pending until it is
                // done (or is redelivered if it fails), so this one is a duplicate.
                RecordState::InProgress { .. }
                | RecordState::Completed(_)
                | RecordState::NotReplayable => Ok(RunOnceOutcome::Duplicate),
            });
        }
        Err(e) => return Err(Err(RunOnceError(Repr::Store(e)))),
    }
    let Some((mut service, mut job)) = inner.take() else {
        tower_once_core::polled_after_completion("ResponseFuture")
    };
    // A store the handler's transaction can write (Postgres): hand the handler its claim.
    let completed = St::COMPLETES_IN_TRANSACTION.then(|| {
        let record = JobRecord::default();
        let (store, key, token) = lease.parts();
        job.extensions_mut().insert(Claim::for_job(
            store.clone(),
            key,
            token,
            retention,
            record.clone(),
        ));
        record
    });
    // The handler is called after the claim, outside the worker's `call`: put the delivery's
    // deadline back in scope so a `TimeoutLayer`/`RetryLayer` inside still sees it.
    let future = match job.deadline() {
        Some(deadline) => deadline.scope(|| service.call(job)),
        None => service.call(job),
    };
    Ok(State::Running {
        future,
        renew_at: tokio::time::sleep(lease.interval()),
        lease,
        completed,
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
