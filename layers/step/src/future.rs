//! The future of a step: its span and metrics, its scope and key, then the mechanism
//! ([`engine`](crate::engine)).

use crate::call::{Step, StepRequest};
use crate::codec::Codec;
use crate::config::Settings;
use crate::engine::{once, Call, Kind};
use crate::error::StepError;
use crate::metrics::{self, Outcome};
use crate::output::Output;
use crate::verify::Verify;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tower_once_core::classify::Classify;
use tower_once_core::deadline::Deadline;
use tower_once_core::unsent::Unsent;
use tower_once_idempotency::store::IdempotencyStore;
use tower_service::Service;
use tracing::Instrument;

/// The future of [`Steps`](crate::Steps).
///
/// NOTE: boxed once per step. A step is a network call (a tool, an API) and one or two store
/// round trips; the box is an allocation among the dozens a call makes, and it keeps the
/// step's state machine (claim, wait, mark, call while renewing, record) readable.
pub struct ResponseFuture<T, E> {
    inner: Pin<Box<dyn Future<Output = Output<T, E>> + Send>>,
}

impl<T, E> ResponseFuture<T, E> {
    pub(crate) fn new(future: impl Future<Output = Output<T, E>> + Send + 'static) -> Self {
        Self {
            inner: Box::pin(future),
        }
    }
}

impl<T, E> Future for ResponseFuture<T, E> {
    type Output = Output<T, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}

impl<T, E> fmt::Debug for ResponseFuture<T, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

pub(crate) fn run<S, St, C, K, V, Req>(
    inner: S,
    settings: Arc<Settings<St, C, K, V>>,
    step: Step<Req>,
) -> impl Future<Output = Output<S::Response, S::Error>> + Send + 'static
where
    S: Service<Req> + Send + 'static,
    S::Future: Send,
    S::Response: Send + 'static,
    S::Error: Unsent + Send + 'static,
    Req: StepRequest + Send + 'static,
    St: IdempotencyStore,
    C: Codec<S::Response> + Send + Sync + 'static,
    K: Classify<S::Response, S::Error> + Send + Sync + 'static,
    V: Verify<S::Response> + Send + Sync + 'static,
{
    // A deadline in scope at the call, or carried by the request (`Deadline::call` on the
    // step attaches it there)...
    let deadline = Deadline::earliest(step.request.deadline(), Deadline::current());
    let span = tracing::info_span!(
        "step",
        step.run = step.id.run(),
        step.position = step.id.step(),
        step.tool = step.id.tool(),
        step.occurrence = step.id.occurrence_number(),
        step.outcome = tracing::field::Empty,
    );
    let outcome_span = span.clone();
    async move {
        // ... or in scope where the step's future is polled (behind a `Buffer`, the caller's).
        let deadline = Deadline::earliest(deadline, Deadline::current());
        let result = steps(inner, &settings, step, deadline).await;
        let outcome = match &result {
            Ok(out) if out.is_replayed() => Outcome::Replayed,
            Ok(out) if out.is_recorded() => Outcome::Called,
            Ok(_) => Outcome::Failed,
            Err(e) if e.is_unknown() => Outcome::Unknown,
            Err(e) if e.is_mismatch() => Outcome::Mismatch,
            Err(e) if e.is_in_progress() => Outcome::InProgress,
            Err(_) => Outcome::Failed,
        };
        outcome_span.record("step.outcome", outcome.as_str());
        metrics::outcome(outcome);
        result
    }
    .instrument(span)
}

async fn steps<S, St, C, K, V, Req>(
    inner: S,
    settings: &Arc<Settings<St, C, K, V>>,
    step: Step<Req>,
    deadline: Option<Deadline>,
) -> Output<S::Response, S::Error>
where
    S: Service<Req>,
    S::Response: Send + 'static,
    S::Error: Unsent + 'static,
    Req: StepRequest,
    St: IdempotencyStore,
    C: Codec<S::Response> + Send + Sync + 'static,
    K: Classify<S::Response, S::Error> + Send + Sync + 'static,
    V: Verify<S::Response> + Send + Sync + 'static,
{
    let policy = step.on_unknown_policy();
    let Step {
        id,
        request,
        arguments,
        scope,
        keyed,
        ..
    } = step;
    let scope = match (scope, settings.scoped) {
        (Some(scope), _) if !scope.is_empty() => scope,
        // An empty scope is every unscoped step's: not a tenant's.
        (_, true) => return Err(StepError::missing_scope()),
        (_, false) => Vec::new(),
    };
    if !id.is_valid() {
        return Err(StepError::invalid());
    }
    let key = id.store_key(&scope);
    let call = Call {
        kind: Kind::Step,
        id,
        key,
        scope,
        request,
        arguments,
        policy,
        keyed,
    };
    once(inner, settings, call, deadline).await
}
