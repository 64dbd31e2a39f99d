//! A claim whose answer has not come, and releasing a claim whose answer was lost: both in the
//! background, counted by the layer's [`Detached`], when no request waits for them any more.

use super::claim::log_finish;
use crate::detached::Detached;
use crate::store::{ClaimOutcome, ClaimToken, IdempotencyStore, StoreError, StoreKey};
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tower_once_core::backoff::Backoff;

/// How many times, and how far apart, a claim that failed is released in the background.
const RELEASE_TRIES: u32 = 4;
const RELEASE_AGAIN: Backoff =
    Backoff::doubling(Duration::from_millis(250), Duration::from_secs(1));

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
    background: &Detached,
) {
    background.spawn(async move {
        for attempt in 1..=RELEASE_TRIES {
            match store.release(key, token).await {
                Ok(_) => return,
                Err(error) if attempt == RELEASE_TRIES => {
                    tracing::warn!(%error, "failed to release a claim whose answer was lost; it frees itself when its lease expires");
                }
                Err(_) => tokio::time::sleep(RELEASE_AGAIN.exponential(attempt)).await,
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
    background: Detached,
}

impl<St: IdempotencyStore> PendingClaim<St> {
    pub(super) fn new(
        store: St,
        key: StoreKey,
        token: ClaimToken,
        future: St::ClaimFuture,
        background: Detached,
    ) -> Self {
        Self {
            future: Some(future),
            store,
            key,
            token,
            background,
        }
    }

    /// The store's answer; afterwards, dropping this does nothing.
    pub(super) fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Result<ClaimOutcome, StoreError>> {
        let Some(future) = self.future.as_mut() else {
            tower_once_core::polled_after_completion("PendingClaim")
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
        self.background.spawn(async move {
            if let Ok(ClaimOutcome::Claimed) = claim.await {
                tracing::debug!("request dropped while claiming; releasing the claim that landed");
                log_finish(store.release(key, token).await, false);
            }
        });
    }
}
