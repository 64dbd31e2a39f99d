//! A claimed step's record and sent mark, settled on every path, and on a task of its own when
//! the step's future is dropped.

use crate::record;
use std::time::{Duration, SystemTime};
use tower_once_idempotency::store::{ClaimToken, Completion, IdempotencyStore, StoreKey};

/// A claimed step's record (and its sent mark), and what becomes of them if the step's future
/// is dropped before it settles them (a caller's timeout, a cancelled run): released, or, for
/// a call that may not be sent twice and may have been, recorded as unknown.
pub(crate) struct Held<St: IdempotencyStore> {
    store: St,
    key: StoreKey,
    token: ClaimToken,
    retention: Duration,
    pub(crate) marker: Option<StoreKey>,
    /// Whether its drop releases the claim (the sent mark stays: the next owner settles it).
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
    /// Completes the step's record (nothing is left to do if dropped after).
    pub(crate) async fn complete(
        &mut self,
        completion: Completion,
        retention: Duration,
    ) -> Result<bool, tower_once_idempotency::store::StoreError> {
        self.armed = false;
        self.store
            .complete(self.key, self.token, completion, retention)
            .await
    }

    /// Frees the step, and its sent mark (the call was not sent, or was refused). Otherwise
    /// the mark stays for the retention, an in-progress claim that no store drops to make
    /// room: if the step's record is dropped (a full memory store), the call is still never
    /// sent blindly again.
    pub(crate) async fn release(&mut self) {
        self.armed = false;
        if let Err(error) = self.store.release(self.key, self.token).await {
            tracing::warn!(%error, "step: could not release its claim; it frees itself when its lease ends");
        }
        self.release_marker().await;
    }

    pub(crate) async fn release_marker(&mut self) {
        if let Some(marker) = self.marker.take() {
            if let Err(error) = self.store.release(marker, self.token).await {
                tracing::warn!(%error, "step: could not remove its sent mark");
            }
        }
    }

    /// Records the step's outcome as unknown, so every later attempt says so too.
    pub(crate) async fn settle_unknown(&mut self, sent_at: SystemTime) {
        self.armed = false;
        let completion = Completion::Response(record::unknown(sent_at));
        let settled = self
            .store
            .complete(self.key, self.token, completion, self.retention);
        if let Err(error) = settled.await {
            tracing::warn!(%error, "step: could not record its unknown outcome; its sent mark still says so");
        }
    }
}

impl<St: IdempotencyStore> Drop for Held<St> {
    fn drop(&mut self) {
        if !std::mem::take(&mut self.armed) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let release = self.store.release(self.key, self.token);
        runtime.spawn(async move {
            if let Err(error) = release.await {
                tracing::warn!(%error, "step: could not release a dropped step; its lease ends it");
            }
        });
    }
}
