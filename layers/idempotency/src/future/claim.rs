//! The life of a claim: renewing its lease while the handler runs, completing or releasing it
//! with a write fenced by its token, and finishing that write on a task of its own (counted by
//! the layer's [`Detached`]) when the request's future is dropped.

use crate::store::{ClaimToken, Completion, IdempotencyStore, StoreError, StoreKey};
use crate::Detached;
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
    // Where a write left in flight by a drop is finished, counted for the shutdown.
    background: Detached,
}

enum Op<St: IdempotencyStore> {
    Held,
    Extending(St::ExtendFuture),
    Completing(St::CompleteFuture),
    Releasing(St::ReleaseFuture),
    Done,
}

impl<St: IdempotencyStore> ClaimGuard<St> {
    pub(super) fn new(store: St, key: StoreKey, token: ClaimToken, background: Detached) -> Self {
        Self {
            store,
            key,
            token,
            op: Op::Held,
            background,
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

    /// Finishes a store write on a task of its own, counted by the layer's [`Detached`].
    fn finish_in_background<Fut>(&self, write: Fut, completing: bool)
    where
        Fut: Future<Output = Result<bool, StoreError>> + Send + 'static,
    {
        self.background
            .spawn(async move { log_finish(write.await, completing) });
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
                self.finish_in_background(self.store.release(self.key, self.token), false);
            }
            Op::Completing(future) => self.finish_in_background(future, true),
            Op::Releasing(future) => self.finish_in_background(future, false),
        }
    }
}

pub(super) fn log_finish(result: Result<bool, StoreError>, completing: bool) {
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
