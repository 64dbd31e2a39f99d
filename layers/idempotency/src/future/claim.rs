//! The life of a claim: renewing its [`Lease`] while the handler runs, completing or releasing it
//! with a write fenced by its token, and finishing that write on a task of its own (counted by
//! the layer's [`Detached`]) when the request's future is dropped.

use crate::detached::Detached;
use crate::store::{Completion, IdempotencyStore, Lease, StoreError};
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::time::Sleep;

/// Owns a claim until it is completed or released; if dropped first (the client went away and
/// cancellation is on), releases the key, or finishes the store write already under way.
pub(super) struct ClaimGuard<St: IdempotencyStore> {
    lease: Lease<St>,
    op: Op<St>,
    // Where a write left in flight by a drop is finished, counted for the shutdown.
    background: Detached,
}

enum Op<St: IdempotencyStore> {
    Held,
    Completing(St::CompleteFuture),
    Releasing(St::ReleaseFuture),
    Done,
}

impl<St: IdempotencyStore> ClaimGuard<St> {
    pub(super) fn new(lease: Lease<St>, background: Detached) -> Self {
        Self {
            lease,
            op: Op::Held,
            background,
        }
    }

    /// Renews the lease each time `timer` fires while the claim is held.
    pub(super) fn poll_renew(&mut self, timer: Pin<&mut Sleep>, cx: &mut Context<'_>) {
        if let Op::Held = self.op {
            self.lease.poll_renew(timer, cx);
        }
    }

    pub(super) fn complete(&mut self, completion: Completion, retention: Duration) {
        let (store, key, token) = self.lease.parts();
        self.op = Op::Completing(store.complete(key, token, completion, retention));
    }

    pub(super) fn release(&mut self) {
        let (store, key, token) = self.lease.parts();
        self.op = Op::Releasing(store.release(key, token));
    }

    /// Hands the claim's lease over (to a task that will finish it): dropping this does
    /// nothing more.
    pub(super) fn disarm(mut self) -> Lease<St> {
        self.op = Op::Done;
        let (store, key, token) = self.lease.parts();
        Lease::new(store.clone(), key, token, self.lease.length())
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
            Op::Held | Op::Done => return Poll::Ready(()),
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
            Op::Held => {
                tracing::debug!("request dropped while running; releasing idempotency key");
                let (store, key, token) = self.lease.parts();
                self.finish_in_background(store.release(key, token), false);
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
