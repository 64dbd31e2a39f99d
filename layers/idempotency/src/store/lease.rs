//! Keeping a claim alive while its work runs.

use super::{ClaimToken, IdempotencyStore, StoreKey};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::{Instant, Sleep};

/// The lease of a claim: renewed, with a write fenced by the claim's token, every third of its
/// length while the work it guards runs, so a slow handler keeps its claim and a crashed
/// process frees the key within one lease. Used by `IdempotencyLayer` for handlers and
/// streamed responses, and by the worker's `RunOnceLayer` for jobs; use it for a claim of your
/// own.
///
/// The caller owns the timer (a `tokio::time::Sleep` set to [`interval`](Self::interval) from
/// the claim), so that work which finishes at once never registers one, and polls
/// [`poll_renew`](Self::poll_renew) whenever the work is pending.
///
/// ```
/// use std::future::Future;
/// use std::time::Duration;
/// use tower_once_idempotency::fingerprint::Fingerprint;
/// use tower_once_idempotency::store::{ClaimToken, IdempotencyStore, Lease, MemoryStore, StoreKey};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store = MemoryStore::new();
/// let (key, token) = (StoreKey::from_bytes([1; 32]), ClaimToken::new());
/// let lease_length = Duration::from_millis(300);
/// store.claim(key, token, Fingerprint::from_bytes([0; 32]), lease_length).await?;
///
/// let mut lease = Lease::new(store.clone(), key, token, lease_length);
/// let mut timer = std::pin::pin!(tokio::time::sleep(lease.interval()));
/// let mut work = std::pin::pin!(tokio::time::sleep(Duration::from_secs(1))); // three leases
/// std::future::poll_fn(|cx| {
///     lease.poll_renew(timer.as_mut(), cx);
///     work.as_mut().poll(cx)
/// })
/// .await;
/// assert!(lease.is_held(), "renewed while the work ran");
/// assert!(store.release(key, token).await?, "still ours after three lease lengths");
/// # Ok(())
/// # }
/// ```
pub struct Lease<St: IdempotencyStore> {
    store: St,
    key: StoreKey,
    token: ClaimToken,
    length: Duration,
    renewal: Option<St::ExtendFuture>,
    held: bool,
}

impl<St: IdempotencyStore> Lease<St> {
    /// The lease of the claim of `key` by `token`, `length` long from each renewal.
    pub fn new(store: St, key: StoreKey, token: ClaimToken, length: Duration) -> Self {
        Self {
            store,
            key,
            token,
            length,
            renewal: None,
            held: true,
        }
    }

    /// How long each renewal holds the claim.
    pub fn length(&self) -> Duration {
        self.length
    }

    /// How often it is renewed: a third of its length.
    pub fn interval(&self) -> Duration {
        self.length / 3
    }

    /// Whether the claim is still ours as far as the last renewal knows: `false` once the store
    /// answered that the record is no longer in progress under this token (the work outlived
    /// its lease and another claim may have taken the key: fence your writes with the token).
    /// A renewal that failed (the store was down) keeps it `true` and is tried again.
    pub fn is_held(&self) -> bool {
        self.held
    }

    /// The store, the key and the token of the claim.
    pub fn parts(&self) -> (&St, StoreKey, ClaimToken) {
        (&self.store, self.key, self.token)
    }

    /// The store, the key and the token of the claim, ending the lease.
    pub fn into_parts(self) -> (St, StoreKey, ClaimToken) {
        (self.store, self.key, self.token)
    }

    /// Drives renewals: finishes the one in flight, and starts the next each time `timer`
    /// fires (resetting it to the next [`interval`](Self::interval)). Call it whenever the
    /// guarded work is pending; it registers the waker for both.
    pub fn poll_renew(&mut self, mut timer: Pin<&mut Sleep>, cx: &mut Context<'_>) {
        // At most two rounds: finish a renewal in flight, then start (and poll) the next one.
        for _ in 0..2 {
            if let Some(renewal) = self.renewal.as_mut() {
                let Poll::Ready(result) = Pin::new(renewal).poll(cx) else {
                    return;
                };
                self.renewal = None;
                match result {
                    Ok(true) => tracing::trace!(store_key = %self.key, "renewed the lease"),
                    Ok(false) => {
                        self.held = false;
                        tracing::warn!(
                            store_key = %self.key,
                            "lease lost: the work outlived its lease and another request may \
                             have claimed the key; fence writes with the ClaimToken"
                        );
                    }
                    Err(error) => {
                        tracing::warn!(store_key = %self.key, %error, "failed to renew the lease; will retry")
                    }
                }
            }
            if timer.as_mut().poll(cx).is_pending() {
                return;
            }
            timer.as_mut().reset(tower_once_core::time::saturating_add(
                Instant::now(),
                self.interval(),
            ));
            if self.held {
                self.renewal = Some(self.store.extend(self.key, self.token, self.length));
            }
        }
    }
}

impl<St: IdempotencyStore + std::fmt::Debug> std::fmt::Debug for Lease<St> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("store", &self.store)
            .field("key", &self.key)
            .field("length", &self.length)
            .field("held", &self.held)
            .finish_non_exhaustive()
    }
}
