//! Run a message's effect once per id: a job from a queue, a webhook, an event, delivered at
//! least once.
//!
//! A queue delivers at least once: a consumer that dies after the effect but before its
//! acknowledgement has the message delivered again, and a producer retried by its caller
//! enqueues the same message twice. [`RunOnceLayer`] is a step whose identity is the
//! message's id ([`Delivery::once_key`]): the same mechanism as [`StepLayer`](crate::StepLayer)
//! (claim, lease renewed while the handler runs, record, release on failure or drop), with a
//! queue's answers:
//!
//! | the store has the message's id | the layer | the consumer then |
//! |---|---|---|
//! | nothing (or an expired claim) | claims it, runs the handler with the lease renewed every third of it; `Ok` → records it done, `Err` → releases the claim | acts on the handler's outcome |
//! | done | returns [`RunOnceOutcome::Duplicate`], the handler does not run | acknowledges |
//! | in progress by another message with the same id (a duplicate enqueue) | returns [`RunOnceOutcome::Duplicate`]: the running one stays pending until it is done, or is delivered again if it fails | acknowledges |
//! | in progress by this very delivery (taken over while it still runs) | returns an error that [`is_in_progress`](RunOnceError::is_in_progress): not waited for | leaves it pending (delivered again) |
//! | store unreachable | returns an error that [`is_store`](RunOnceError::is_store) | leaves it pending |
//!
//! A run dropped while its handler runs (a panic, a cancelled deadline or shutdown) releases
//! its claim at once, on a task of its own (fenced by the claim: a record that committed
//! stays). On a store whose records the handler's transaction can write (the Postgres store),
//! the handler gets the store's [`Claim`](tower_once_idempotency::Claim) in the message's
//! extensions and records the run done in the transaction of its effects; once it returns
//! `Ok`, the layer reads the record: committed, it writes nothing more; rolled back with the
//! effects, the run is an error ([`is_rolled_back`](RunOnceError::is_rolled_back)) so the
//! message runs again. A transaction still open (handed to a task, its rollback not sent yet)
//! is read again until it ends, for up to a third of the lease; still open then, or a read
//! that fails, and the run is an error that [`is_store`](RunOnceError::is_store), its claim
//! held to its lease: never acknowledged before its record is known, so the next delivery
//! finds it done (a duplicate) or free (it runs).
//!
//! The worker of `tower-once-worker` implements [`Delivery`] for its jobs, and re-exports
//! this layer; its docs show run-once in a job's transaction.

mod error;
mod handler;
mod outcome;

pub use self::error::RunOnceError;
pub use self::handler::ResponseFuture;
pub use self::outcome::RunOnceOutcome;

use self::error::Repr;
use self::handler::{Failed, Handler, Nothing};
use crate::call::{OnUnknown, StepRequest};
use crate::config::{Settings, DEFAULT_MAX_WAIT, DEFAULT_RESULT_LIMIT};
use crate::engine::{once, Call, Kind};
use crate::error::{Cause, StepError};
use crate::id::StepId;
use crate::output::StepOutput;
use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tower_layer::Layer;
use tower_once_core::classify::RetryOnError;
use tower_once_idempotency::fingerprint::Fingerprint;
use tower_once_idempotency::store::{IdempotencyStore, StoreError, StoreKey};
use tower_service::Service;

/// Default lease of a run-once claim (30 s; a step's is 10 s).
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// Default retention of a run-once "done" record (24 h; a step's is 7 days).
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(24 * 3600);

/// A message delivered at least once whose effect must happen once per id.
/// [`RunOnceLayer`] runs it once per [`once_key`](Self::once_key).
///
/// Two identities, and each must be stable:
///
/// - [`once_key`](Self::once_key) names the **effect**: the same for every delivery of the
///   message and for every duplicate enqueue of it. Derive it from what the effect is about (a
///   job id the producer chose, `welcome/{user_id}`), not from an id the queue assigns to each
///   enqueue (SQS gives a duplicate enqueue a new `MessageId`).
/// - [`delivery`](Self::delivery) names the **queue entry**: the same for every redelivery of
///   that entry (a Redis Streams entry id, an SQS `MessageId`), never a per-receive handle (an
///   SQS `ReceiptHandle` changes on every receive: a redelivery while the first run still runs
///   would then read as a duplicate enqueue and be acknowledged, and if the first run then
///   failed, the entry would be gone).
///
/// Run-once records share the store (and a Redis store's key prefix) with the idempotency
/// layer's and the steps' records: derive the key as a hash over a tag of your own and the id.
///
/// ```
/// use sha2::{Digest, Sha256};
/// use tower::{Layer, ServiceExt};
/// use tower_once_idempotency::fingerprint::Fingerprint;
/// use tower_once_idempotency::store::{MemoryStore, StoreKey};
/// use tower_once_step::run_once::{Delivery, RunOnceLayer, RunOnceOutcome};
/// use tower_once_step::StepRequest;
///
/// /// A "user signed up" message: the effect is one welcome mail per user; `message_id` is
/// /// the queue's id of this entry (the same on every redelivery of it).
/// #[derive(Clone)]
/// struct SignedUp { user_id: u64, message_id: String }
///
/// impl StepRequest for SignedUp {}
///
/// impl Delivery for SignedUp {
///     fn once_key(&self) -> StoreKey {
///         let digest = Sha256::new()
///             .chain_update("welcome-mail/v1\0")
///             .chain_update(self.user_id.to_be_bytes());
///         StoreKey::from_bytes(digest.finalize().into())
///     }
///     fn delivery(&self) -> Fingerprint {
///         Fingerprint::from_bytes(Sha256::digest(&self.message_id).into())
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let send_welcome = tower::service_fn(|m: SignedUp| async move {
///     Ok::<_, std::io::Error>(format!("mail to user {}", m.user_id))
/// });
/// let consumer = RunOnceLayer::new(MemoryStore::new()).layer(send_welcome);
///
/// let message = SignedUp { user_id: 7, message_id: "m-1".into() };
/// let first = consumer.clone().oneshot(message.clone()).await.unwrap();
/// assert_eq!(first, RunOnceOutcome::Done("mail to user 7".to_owned()));
/// // Redelivered, or enqueued twice (another entry, same user): acknowledged unrun.
/// let again = consumer.clone().oneshot(message).await.unwrap();
/// assert!(again.is_duplicate());
/// let twice = SignedUp { user_id: 7, message_id: "m-2".into() };
/// assert!(consumer.oneshot(twice).await.unwrap().is_duplicate());
/// # }
/// ```
pub trait Delivery: StepRequest {
    /// The store key of the effect the message names: the same for every delivery of it and
    /// every duplicate enqueue. Derive it with a prefix of your own (a hash over a tag and
    /// the id), so it never meets another kind of record in a shared store.
    fn once_key(&self) -> StoreKey;

    /// Which queue entry this is, the same on every redelivery of it (a stream entry id, an
    /// SQS `MessageId`; never a per-receive handle): a redelivery of the entry while it runs
    /// is left in progress (acknowledging it would lose the message if the running one then
    /// fails), while another entry with the same key is a duplicate.
    fn delivery(&self) -> Fingerprint;
}

/// Wraps a handler so each message's effect runs once per id. See the [module docs](self).
///
/// The handler's deadline ([`StepRequest::deadline`]) is put back in scope around its call,
/// so a `TimeoutLayer` or `RetryLayer` inside still sees it after the claim. The handler (a
/// `Clone` service), its future, response and error, and the message must be `Send +
/// 'static`: the run is one boxed `Send` future, as a step's is. Through the `tower-once`
/// crate, this module is `tower_once::step::run_once`. An example is on [`Delivery`].
///
/// Under a queue that redelivers an entry not acknowledged within some time (the worker's
/// `claim_idle`, SQS's visibility timeout), use a [`lease`](Self::lease) of at most half of
/// it, so a crashed run's claim has expired by the time its entry comes back.
#[derive(Debug, Clone)]
pub struct RunOnceLayer<St> {
    store: St,
    lease: Duration,
    retention: Duration,
}

impl<St> RunOnceLayer<St> {
    /// Run-once on `store`, with a 30 s lease and 24 h retention.
    pub const fn new(store: St) -> Self {
        Self {
            store,
            lease: DEFAULT_LEASE,
            retention: DEFAULT_RETENTION,
        }
    }

    /// How long a claim lives without renewal; renewed every third of it while the handler
    /// runs. A delivery arriving while a dead consumer's claim is unexpired is left pending.
    /// Under a queue that redelivers a silent consumer's messages after some idle time (the
    /// worker's `claim_idle`), use at most half of it: the crashed delivery's claim has then
    /// always expired by the time its message is taken over.
    ///
    /// # Panics
    ///
    /// If `lease` is under 3 ms.
    pub fn lease(mut self, lease: Duration) -> Self {
        assert!(
            lease >= Duration::from_millis(3),
            "RunOnceLayer::lease must be at least 3 ms"
        );
        self.lease = lease;
        self
    }

    /// How long a "done" record is kept (duplicates within it are acknowledged unrun).
    ///
    /// # Panics
    ///
    /// If `retention` is zero.
    pub fn retention(mut self, retention: Duration) -> Self {
        assert!(
            !retention.is_zero(),
            "RunOnceLayer::retention must not be zero"
        );
        self.retention = retention;
        self
    }
}

impl<S, St: Clone> Layer<S> for RunOnceLayer<St> {
    type Service = RunOnce<S, St>;

    fn layer(&self, inner: S) -> Self::Service {
        RunOnce {
            inner,
            settings: Arc::new(Settings {
                store: self.store.clone(),
                codec: Nothing,
                classifier: RetryOnError,
                verify: (),
                lease: self.lease,
                retention: self.retention,
                max_wait: DEFAULT_MAX_WAIT,
                result_limit: DEFAULT_RESULT_LIMIT,
                scoped: false,
            }),
        }
    }
}

/// The service of [`RunOnceLayer`].
pub struct RunOnce<S, St> {
    inner: S,
    settings: Arc<Settings<St, Nothing, RetryOnError, ()>>,
}

impl<S, St> RunOnce<S, St> {
    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, consuming this one.
    pub fn into_inner(self) -> S {
        self.inner
    }

    /// The store of the run-once records.
    pub fn store_ref(&self) -> &St {
        &self.settings.store
    }
}

impl<S: Clone, St> Clone for RunOnce<S, St> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            settings: Arc::clone(&self.settings),
        }
    }
}

impl<S: fmt::Debug, St: fmt::Debug> fmt::Debug for RunOnce<S, St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunOnce")
            .field("inner", &self.inner)
            .field("store", &self.settings.store)
            .field("lease", &self.settings.lease)
            .field("retention", &self.settings.retention)
            .finish()
    }
}

impl<S, St, Req> Service<Req> for RunOnce<S, St>
where
    S: Service<Req> + Clone + Send + 'static,
    S::Future: Send,
    S::Response: Send + 'static,
    S::Error: Send + 'static,
    Req: Delivery + Send + 'static,
    St: IdempotencyStore,
{
    type Response = RunOnceOutcome<S::Response>;
    type Error = RunOnceError<S::Error>;
    type Future = ResponseFuture<S::Response, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(RunOnceError::inner)
    }

    fn call(&mut self, message: Req) -> Self::Future {
        // The ready service goes into the future; the clone stays for the next poll_ready.
        let clone = self.inner.clone();
        let handler = Handler(std::mem::replace(&mut self.inner, clone));
        let settings = Arc::clone(&self.settings);
        let deadline = message.deadline();
        ResponseFuture::new(async move {
            // NOTE: the record's fingerprint names the delivery that claimed it, so that a
            // second delivery can tell another message with the same id (a duplicate: its
            // record's fingerprint differs) from the same delivery again while it runs.
            let call = Call {
                kind: Kind::Delivery,
                // Never marked, verified nor keyed (its policy is `RunAgain`): the step id
                // names nothing, and costs no allocation.
                id: StepId::new(String::new(), 0, String::new()),
                key: message.once_key(),
                scope: Vec::new(),
                arguments: message.delivery(),
                request: message,
                // A failed run is run again: at least once, once per id when it succeeds.
                policy: OnUnknown::RunAgain,
                keyed: false,
            };
            answer(once(handler, &settings, call, deadline).await)
        })
    }
}

/// What the step mechanism's answer is to a consumer.
fn answer<R, E>(
    output: Result<StepOutput<RunOnceOutcome<R>>, StepError<Failed<E>>>,
) -> Result<RunOnceOutcome<R>, RunOnceError<E>> {
    match output {
        Ok(output) if output.is_rolled_back() => Err(RunOnceError(Repr::RolledBack)),
        // Not acknowledged before it is known: left pending, the claim held to its lease; the
        // next delivery finds the record done (a duplicate) or the id free (it runs).
        Ok(output) if output.is_unsettled() => Err(RunOnceError(Repr::Store(
            StoreError::unavailable(
                "could not tell whether the handler's transaction committed its record (still open, or the read failed); left to the record",
            ),
        ))),
        // Done now (recorded, or, when the record could not be written, logged: the effect
        // happened), or a duplicate of a done run.
        Ok(output) => Ok(output.into_value()),
        Err(error) => match error.into_cause() {
            // The id's record names another delivery: a duplicate of a message that ran,
            // or of one still running (which stays pending until it is done).
            Cause::Mismatch => Ok(RunOnceOutcome::Duplicate),
            Cause::InProgress => Err(RunOnceError(Repr::InProgress)),
            Cause::Inner(Failed(e)) => Err(RunOnceError(Repr::Inner(e))),
            Cause::Store(e) => Err(RunOnceError(Repr::Store(e))),
            Cause::Other(why) => Err(RunOnceError(Repr::Store(StoreError::corrupt(why)))),
        },
    }
}
