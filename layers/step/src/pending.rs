//! A claim on its way to the store, never lost: dropped before its answer (a caller's
//! timeout), it is finished on a task of its own and released if it took the key, as the
//! store contract asks of a layer.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use tower_once_idempotency::store::{
    ClaimOutcome, ClaimToken, IdempotencyStore, StoreError, StoreKey,
};

/// A claim in flight. See the [module docs](self).
pub(crate) struct Pending<St: IdempotencyStore> {
    claim: Option<St::ClaimFuture>,
    store: St,
    key: StoreKey,
    token: ClaimToken,
}

impl<St: IdempotencyStore> Pending<St> {
    pub(crate) fn claim(
        store: &St,
        key: StoreKey,
        token: ClaimToken,
        claim: St::ClaimFuture,
    ) -> Self {
        Self {
            claim: Some(claim),
            store: store.clone(),
            key,
            token,
        }
    }
}

// Nothing in it is structurally pinned: the claim future is `Unpin` by the store contract.
impl<St: IdempotencyStore> Unpin for Pending<St> {}

impl<St: IdempotencyStore> Future for Pending<St> {
    type Output = Result<ClaimOutcome, StoreError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let Some(claim) = self.claim.as_mut() else {
            tower_once_core::polled_after_completion("Pending")
        };
        let outcome = std::task::ready!(Pin::new(claim).poll(cx));
        self.claim = None;
        Poll::Ready(outcome)
    }
}

impl<St: IdempotencyStore> Drop for Pending<St> {
    fn drop(&mut self) {
        let Some(claim) = self.claim.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (store, key, token) = (self.store.clone(), self.key, self.token);
        runtime.spawn(async move {
            if let Ok(ClaimOutcome::Claimed) = claim.await {
                if let Err(error) = store.release(key, token).await {
                    tracing::warn!(%error, "step: could not release a claim its dropped step made; its lease ends it");
                }
            }
        });
    }
}
