//! The life of a claim: renewing its lease while the handler runs, completing or releasing it
//! with a write fenced by its token, and finishing that work on a task of its own when the
//! request's future is dropped.

use crate::body::HeldClaim;
use crate::store::{ClaimOutcome, ClaimToken, Completion, IdempotencyStore, StoreError, StoreKey};
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::time::{Instant, Sleep};

pub(super) fn renew_interval(lease: Duration) -> Duration {
    lease / 3
}

/// Owns a claim until it is completed or released; if dropped first (the client went away and
/// cancellation is on), releases the key, or finishes the store write already under way.
pub(super) struct ClaimGuard<St: IdempotencyStore> {
    store: St,
    key: StoreKey,
    token: ClaimToken,
    op: Op<St>,
}

enum Op<St: IdempotencyStore> {
    Held,
    Extending(St::ExtendFuture),
    Completing(St::CompleteFuture),
    Releasing(St::ReleaseFuture),
    Done,
}

impl<St: IdempotencyStore> ClaimGuard<St> {
    pub(super) fn new(store: St, key: StoreKey, token: ClaimToken) -> Self {
        Self {
            store,
            key,
            token,
            op: Op::Held,
        }
    }

    fn extend(&mut self, lease: Duration) {
        if let Op::Held = self.op {
            self.op = Op::Extending(self.store.extend(self.key, self.token, lease));
        }
    }

    fn poll_extend(&mut self, cx: &mut Context<'_>) {
        let Op::Extending(future) = &mut self.op else {
            return;
        };
        let Poll::Ready(result) = Pin::new(future).poll(cx) else {
            return;
        };
        self.op = Op::Held;
        match result {
            Ok(true) => tracing::trace!("renewed idempotency lease"),
            Ok(false) => tracing::warn!(
                "idempotency lease lost: the handler outlived its lease and another request may \
                 have claimed the key; use the ClaimToken extension to fence writes"
            ),
            Err(error) => tracing::warn!(%error, "failed to renew idempotency lease; will retry"),
        }
    }

    /// Renews the lease each time `timer` fires, and drives a renewal in flight.
    pub(super) fn poll_renew(
        &mut self,
        mut timer: Pin<&mut Sleep>,
        lease: Duration,
        cx: &mut Context<'_>,
    ) {
        self.poll_extend(cx);
        while timer.as_mut().poll(cx).is_ready() {
            timer.as_mut().reset(Instant::now() + renew_interval(lease));
            self.extend(lease);
            self.poll_extend(cx);
        }
    }

    pub(super) fn complete(&mut self, completion: Completion, retention: Duration) {
        self.op = Op::Completing(
            self.store
                .complete(self.key, self.token, completion, retention),
        );
    }

    pub(super) fn release(&mut self) {
        self.op = Op::Releasing(self.store.release(self.key, self.token));
    }

    /// Hands the claim over (to a task that will finish it): dropping this does nothing more.
    pub(super) fn disarm(mut self) -> (St, StoreKey, ClaimToken) {
        self.op = Op::Done;
        (self.store.clone(), self.key, self.token)
    }

    pub(super) fn poll_finish(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let (result, completing) = match &mut self.op {
            Op::Completing(future) => (ready!(Pin::new(future).poll(cx)), true),
            Op::Releasing(future) => (ready!(Pin::new(future).poll(cx)), false),
            Op::Held | Op::Extending(_) | Op::Done => return Poll::Ready(()),
        };
        self.op = Op::Done;
        log_finish(result, completing);
        Poll::Ready(())
    }
}

impl<St: IdempotencyStore> Drop for ClaimGuard<St> {
    fn drop(&mut self) {
        match std::mem::replace(&mut self.op, Op::Done) {
            Op::Done => {}
            Op::Held | Op::Extending(_) => {
                tracing::debug!("request dropped while running; releasing idempotency key");
                spawn_detached(self.store.release(self.key, self.token), false);
            }
            Op::Completing(future) => spawn_detached(future, true),
            Op::Releasing(future) => spawn_detached(future, false),
        }
    }
}

fn log_finish(result: Result<bool, StoreError>, completing: bool) {
    match (result, completing) {
        (Ok(true), _) => {}
        (Ok(false), true) => {
            tracing::warn!("idempotency claim lost before completion: the response was not stored")
        }
        (Ok(false), false) => tracing::debug!("idempotency claim already gone at release"),
        (Err(error), true) => tracing::error!(
            %error,
            "failed to store idempotent response; duplicates get 409 until the lease expires, \
             then run again"
        ),
        (Err(error), false) => tracing::warn!(
            %error,
            "failed to release idempotency key; it frees itself when its lease expires"
        ),
    }
}

fn spawn_detached<Fut>(future: Fut, completing: bool)
where
    Fut: Future<Output = Result<bool, StoreError>> + Send + 'static,
{
    spawn_or_warn(async move { log_finish(future.await, completing) });
}

/// Runs `work` on a task of its own (store work, or a handler whose client went away).
pub(super) fn spawn_or_warn(work: impl Future<Output = ()> + Send + 'static) {
    match tokio::runtime::Handle::try_current() {
        Ok(handle) => {
            handle.spawn(work);
        }
        Err(_) => tracing::warn!(
            "no tokio runtime to finish an idempotency store operation; the key frees itself \
             when its lease expires"
        ),
    }
}

/// How many times, and how far apart, a claim that failed is released in the background.
const RELEASE_TRIES: u32 = 4;
const RELEASE_PAUSE: Duration = Duration::from_millis(250);

/// Releases a claim whose answer never came (the store timed out or the connection failed).
///
/// NOTE: a remote store applies a claim when the command arrives, even if its reply is late or
/// lost; without this, such a claim would hold the key for a whole lease and every retry would
/// get `409`. The release is fenced by this request's own token, so it never frees a claim
/// that is not ours, and it is sent after the claim on the same connection, so it lands after
/// it.
pub(super) fn release_in_background<St: IdempotencyStore>(
    store: St,
    key: StoreKey,
    token: ClaimToken,
) {
    spawn_or_warn(async move {
        for attempt in 1..=RELEASE_TRIES {
            match store.release(key, token).await {
                Ok(_) => return,
                Err(error) if attempt == RELEASE_TRIES => {
                    tracing::warn!(%error, "failed to release a claim whose answer was lost; it frees itself when its lease expires");
                }
                Err(_) => tokio::time::sleep(RELEASE_PAUSE * attempt).await,
            }
        }
    });
}

/// A claim sent to the store whose answer has not arrived yet.
///
/// NOTE: if dropped before the answer (the client went away), this finishes the claim in the
/// background and releases the key if the claim won, for the same reason as
/// [`release_in_background`].
pub(super) struct PendingClaim<St: IdempotencyStore> {
    future: Option<St::ClaimFuture>,
    store: St,
    key: StoreKey,
    token: ClaimToken,
}

impl<St: IdempotencyStore> PendingClaim<St> {
    pub(super) fn new(
        store: St,
        key: StoreKey,
        token: ClaimToken,
        future: St::ClaimFuture,
    ) -> Self {
        Self {
            future: Some(future),
            store,
            key,
            token,
        }
    }

    /// The store's answer; afterwards, dropping this does nothing.
    pub(super) fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Result<ClaimOutcome, StoreError>> {
        let Some(future) = self.future.as_mut() else {
            return Poll::Ready(Err(StoreError::unavailable(
                "claim polled after its answer",
            )));
        };
        let outcome = ready!(Pin::new(future).poll(cx));
        self.future = None;
        Poll::Ready(outcome)
    }
}

impl<St: IdempotencyStore> Drop for PendingClaim<St> {
    fn drop(&mut self) {
        let Some(claim) = self.future.take() else {
            return;
        };
        let (store, key, token) = (self.store.clone(), self.key, self.token);
        spawn_or_warn(async move {
            if let Ok(ClaimOutcome::Claimed) = claim.await {
                tracing::debug!("request dropped while claiming; releasing the claim that landed");
                log_finish(store.release(key, token).await, false);
            }
        });
    }
}

/// A claim handed to a response body that streams past the store limit: kept alive by a task
/// of its own (renewed every third of the lease, whether or not the client reads), kept as not
/// replayable when the body ends (or the client leaves: the handler ran), released if the body
/// fails.
///
/// NOTE: the renewal cannot live in the body's `poll_frame`: a client that stops reading stops
/// the server from polling the body, the lease would lapse and a duplicate would run again.
pub(super) struct StreamingClaim {
    end: Option<tokio::sync::oneshot::Sender<bool>>,
}

impl StreamingClaim {
    pub(super) fn new<St: IdempotencyStore>(
        claim: ClaimGuard<St>,
        lease: Duration,
        retention: Duration,
        detached: &crate::Detached,
    ) -> Self {
        let (store, key, token) = claim.disarm();
        let (end, ended) = tokio::sync::oneshot::channel();
        detached.spawn(hold(store, key, token, lease, retention, ended));
        Self { end: Some(end) }
    }
}

/// Renews the claim until the body ends, then completes it as not replayable or releases it.
async fn hold<St: IdempotencyStore>(
    store: St,
    key: StoreKey,
    token: ClaimToken,
    lease: Duration,
    retention: Duration,
    mut ended: tokio::sync::oneshot::Receiver<bool>,
) {
    let kept = loop {
        let mut timer = std::pin::pin!(tokio::time::sleep(renew_interval(lease)));
        let ended = std::future::poll_fn(|cx| {
            if let Poll::Ready(kept) = Pin::new(&mut ended).poll(cx) {
                // A body dropped without a word was left by its client: the handler ran.
                return Poll::Ready(Some(kept.unwrap_or(true)));
            }
            timer.as_mut().poll(cx).map(|()| None)
        })
        .await;
        match ended {
            Some(kept) => break kept,
            None => match store.extend(key, token, lease).await {
                Ok(true) => tracing::trace!("renewed the claim of a streaming response"),
                Ok(false) => {
                    tracing::warn!("the claim of a streaming response was lost");
                    return;
                }
                Err(error) => {
                    tracing::warn!(%error, "failed to renew the claim of a streaming response; will retry")
                }
            },
        }
    };
    if kept {
        let done = store
            .complete(key, token, Completion::NotReplayable, retention)
            .await;
        log_finish(done, true);
    } else {
        tracing::debug!("response body failed after the store limit; releasing the key");
        log_finish(store.release(key, token).await, false);
    }
}

impl HeldClaim for StreamingClaim {
    fn end(mut self: Box<Self>, kept: bool) {
        if let Some(end) = self.end.take() {
            let _ = end.send(kept);
        }
    }
}
