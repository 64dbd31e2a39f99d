//! A claim held by a response that streams past the store limit, until its body ends.

use super::claim::{log_finish, ClaimGuard};
use crate::body::HeldClaim;
use crate::store::{Completion, IdempotencyStore, Lease};
use std::future::Future;
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

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
        retention: Duration,
        detached: &crate::detached::Detached,
    ) -> Self {
        let lease = claim.disarm();
        let (end, ended) = tokio::sync::oneshot::channel();
        detached.spawn(hold(lease, retention, ended));
        Self { end: Some(end) }
    }
}

/// Renews the claim until the body ends, then completes it as not replayable or releases it.
async fn hold<St: IdempotencyStore>(
    mut lease: Lease<St>,
    retention: Duration,
    mut ended: tokio::sync::oneshot::Receiver<bool>,
) {
    let mut timer = std::pin::pin!(tokio::time::sleep(lease.interval()));
    let kept = std::future::poll_fn(|cx| {
        if let Poll::Ready(kept) = Pin::new(&mut ended).poll(cx) {
            // A body dropped without a word was left by its client: the handler ran.
            return Poll::Ready(kept.unwrap_or(true));
        }
        lease.poll_renew(timer.as_mut(), cx);
        Poll::Pending
    })
    .await;
    let (store, key, token) = lease.into_parts();
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
