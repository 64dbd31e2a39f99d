//! A claimed step's record and sent mark: renewed while the step works, settled on every path,
//! and every write finished on a task of its own when the step's future is dropped.

use crate::record;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};
use tower_once_idempotency::store::{
    ClaimToken, Completion, IdempotencyStore, Lease, StoreError, StoreKey,
};

/// A claimed step's record (and its sent mark), and what becomes of them if the step's future
/// is dropped before it settles them (a caller's timeout, a cancelled run): the claim is
/// released and the mark stays, so the next owner settles a call that may have been sent.
pub(crate) struct Held<St: IdempotencyStore> {
    store: St,
    key: StoreKey,
    token: ClaimToken,
    retention: Duration,
    pub(crate) marker: Option<StoreKey>,
    /// Whether its drop releases the claim.
    pub(crate) armed: bool,
}

impl<St: IdempotencyStore> Held<St> {
    /// A step just claimed: released if dropped before anything else is decided.
    pub(crate) fn new(store: St, key: StoreKey, token: ClaimToken, retention: Duration) -> Self {
        Self {
            store,
            key,
            token,
            retention,
            marker: None,
            armed: true,
        }
    }

    /// Runs `work` (the call, a lookup) with the claim renewed every third of `lease`, and the
    /// sent mark every third of the retention (a call longer than the retention keeps it).
    pub(crate) async fn renewed<F: Future>(&self, lease: Duration, work: F) -> F::Output {
        let (store, token) = (&self.store, self.token);
        let mut claim = Lease::new(store.clone(), self.key, token, lease);
        let mut claim_timer = std::pin::pin!(tokio::time::sleep(claim.interval()));
        // The mark's timer only when there is a mark: most calls have none.
        let mut mark = self.marker.map(|marker| {
            let mark = Lease::new(store.clone(), marker, token, self.retention);
            let timer = Box::pin(tokio::time::sleep(mark.interval()));
            (mark, timer)
        });
        let mut work = std::pin::pin!(work);
        std::future::poll_fn(|cx| {
            claim.poll_renew(claim_timer.as_mut(), cx);
            if let Some((mark, timer)) = mark.as_mut() {
                mark.poll_renew(timer.as_mut(), cx);
            }
            work.as_mut().poll(cx)
        })
        .await
    }

    /// Completes the step's record.
    pub(crate) async fn complete(
        &mut self,
        completion: Completion,
        retention: Duration,
    ) -> Result<bool, StoreError> {
        self.armed = false;
        let complete = self
            .store
            .complete(self.key, self.token, completion, retention);
        Finish::new(complete).await
    }

    /// Frees the step, and its sent mark (the call was not sent, or was refused). Otherwise
    /// the mark stays for the retention, an in-progress claim: if the step's record is dropped
    /// (a full memory store), the call is still never sent blindly again.
    pub(crate) async fn release(&mut self) {
        self.armed = false;
        let release = self.store.release(self.key, self.token);
        if let Err(error) = Finish::new(release).await {
            tracing::warn!(%error, "step: could not release its claim; it frees itself when its lease ends");
        }
        if let Some(marker) = self.marker.take() {
            let release = self.store.release(marker, self.token);
            if let Err(error) = Finish::new(release).await {
                tracing::warn!(%error, "step: could not remove its sent mark");
            }
        }
    }

    /// Records the step's outcome as unknown, so every later attempt says so too.
    pub(crate) async fn settle_unknown(&mut self, sent_at: SystemTime, key: &str) {
        let completion = Completion::Response(record::unknown(sent_at, key));
        let retention = self.retention;
        if let Err(error) = self.complete(completion, retention).await {
            tracing::warn!(%error, "step: could not record its unknown outcome; its sent mark still says so");
        }
    }
}

impl<St: IdempotencyStore> Drop for Held<St> {
    fn drop(&mut self) {
        if !std::mem::take(&mut self.armed) {
            return;
        }
        drop(Finish::new(self.store.release(self.key, self.token)));
    }
}

/// A store write that is never lost: dropped before it finished (the step's caller gave up),
/// it is finished on a task of its own, as the store contract asks of a layer.
struct Finish<F: Future + Unpin + Send + 'static>(Option<F>)
where
    F::Output: Send;

impl<F: Future + Unpin + Send + 'static> Finish<F>
where
    F::Output: Send,
{
    fn new(write: F) -> Self {
        Self(Some(write))
    }
}

impl<F: Future + Unpin + Send + 'static> Future for Finish<F>
where
    F::Output: Send,
{
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let Some(write) = self.0.as_mut() else {
            tower_once_core::polled_after_completion("Finish")
        };
        let done = std::task::ready!(Pin::new(write).poll(cx));
        self.0 = None;
        Poll::Ready(done)
    }
}

impl<F: Future + Unpin + Send + 'static> Drop for Finish<F>
where
    F::Output: Send,
{
    fn drop(&mut self) {
        let Some(write) = self.0.take() else {
            return;
        };
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = write.await;
            });
        }
    }
}
