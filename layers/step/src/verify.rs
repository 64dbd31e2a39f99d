//! Asking the downstream whether a call whose outcome is unknown happened.

use crate::id::StepId;
use std::future::{ready, Future, Ready};
use std::time::SystemTime;

/// What the downstream says about a call whose outcome is unknown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verified<T> {
    /// It happened, with this result: recorded as the step's result, nothing sent.
    Happened(T),
    /// It did not happen: the call is sent (again).
    NotHappened,
    /// The downstream cannot tell: the step's outcome is recorded as unknown.
    Unknown,
}

/// Asks the downstream whether the call of step `id`, sent at `sent_at` and never recorded,
/// happened. Consulted for a step whose policy is [`OnUnknown::Refuse`](crate::OnUnknown):
/// when a later attempt finds the earlier one's sent mark, when the call fails in a way that
/// may have run (a timeout, a reset), and when it is answered with a failure that may follow
/// its effect (the classifier's `Action::Retry` or `InProgress`: a `5xx`, a `429`). `()` (the
/// default) always answers [`Verified::Unknown`].
///
/// The step's claim is renewed while the hook runs, but the hook is not bounded by the step's
/// deadline: bound its lookup yourself. `sent_at` is when the first attempt that may have had
/// the effect was sent (after a "not happened" and a second send, still the first's).
///
/// Any `Fn(&StepId, SystemTime) -> Future<Output = Verified<T>>` is one:
///
/// ```
/// use std::time::SystemTime;
/// use tower_once_step::{StepId, StepLayer, Verified};
/// use tower_once_idempotency::store::MemoryStore;
///
/// // Look the note up by its run: the notes API can list a run's notes.
/// let layer = StepLayer::new(MemoryStore::new()).verify(|id: &StepId, _sent_at: SystemTime| {
///     let run = id.run().to_owned();
///     async move {
///         let found: Option<String> = None; // e.g. GET /notes?run={run}
///         match found {
///             Some(note) => Verified::Happened(note),
///             None => Verified::NotHappened,
///         }
///     }
/// });
/// # let _ = layer;
/// ```
pub trait Verify<T> {
    /// The answer's future.
    type Future: Future<Output = Verified<T>> + Send;

    /// Whether the call of step `id` sent at `sent_at` happened.
    fn verify(&self, id: &StepId, sent_at: SystemTime) -> Self::Future;
}

impl<T: Send> Verify<T> for () {
    type Future = Ready<Verified<T>>;

    fn verify(&self, _: &StepId, _: SystemTime) -> Self::Future {
        ready(Verified::Unknown)
    }
}

impl<T, F, Fut> Verify<T> for F
where
    F: Fn(&StepId, SystemTime) -> Fut,
    Fut: Future<Output = Verified<T>> + Send,
{
    type Future = Fut;

    fn verify(&self, id: &StepId, sent_at: SystemTime) -> Fut {
        self(id, sent_at)
    }
}
