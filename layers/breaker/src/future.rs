//! The response future: the call's outcome, classified and counted by its circuit.

use crate::circuit::Outcome;
use crate::error::{BreakerError, CircuitOpen};
use crate::guard::Guard;
use crate::registry::Config;
use pin_project_lite::pin_project;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use tokio::time::Instant;
use tower_once_core::attempt::Attempt;
use tower_once_core::classify::{Action, Classify};
use tower_once_core::shard::Padded;

pin_project! {
    /// Response future of [`CircuitBreaker`](crate::CircuitBreaker).
    pub struct ResponseFuture<F, K, C> {
        #[pin]
        state: State<F>,
        config: Option<Arc<Padded<Config<K, C>>>>,
        guard: Option<Guard>,
        // When the call started, if slow calls count as failures.
        started: Option<Instant>,
        // Whether the call counts is decided at the first poll, by the retry attempt in scope.
        in_scope: bool,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        Called { #[pin] future: F },
        Refused { open: Option<CircuitOpen> },
    }
}

impl<F, K, C> ResponseFuture<F, K, C> {
    pub(crate) fn called(
        future: F,
        config: Arc<Padded<Config<K, C>>>,
        guard: Guard,
        started: Option<Instant>,
        in_scope: bool,
    ) -> Self {
        Self {
            state: State::Called { future },
            config: Some(config),
            guard: Some(guard),
            started,
            in_scope,
        }
    }

    pub(crate) fn refused(open: CircuitOpen) -> Self {
        Self {
            state: State::Refused { open: Some(open) },
            config: None,
            guard: None,
            started: None,
            in_scope: false,
        }
    }
}

impl<F, Res, E, K, C> Future for ResponseFuture<F, K, C>
where
    F: Future<Output = Result<Res, E>>,
    C: Classify<Res, E>,
{
    type Output = Result<Res, BreakerError<E>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        match this.state.project() {
            StateProj::Called { future } => {
                if std::mem::take(this.in_scope) {
                    let first = Attempt::current().is_none_or(Attempt::is_first);
                    *this.guard = this.guard.take().map(|guard| guard.counted(first));
                }
                let outcome = ready!(future.poll(cx));
                let (Some(config), Some(guard)) = (this.config.as_ref(), this.guard.take()) else {
                    tower_once_core::polled_after_completion("CircuitBreaker's ResponseFuture");
                };
                let policy = config.registry.policy();
                let mut counted = match config.classifier.classify(&outcome) {
                    Action::Success => Outcome::Success,
                    Action::Retry { .. } => Outcome::Failure,
                    // The caller's fault, or "still running elsewhere": the dependency is fine.
                    _ => Outcome::Neutral,
                };
                if let (Outcome::Success, Some(started), Some(slow)) =
                    (counted, *this.started, policy.slow_call)
                {
                    if started.elapsed() >= slow {
                        counted = Outcome::Failure;
                    }
                }
                guard.settle(counted);
                Poll::Ready(outcome.map_err(BreakerError::inner))
            }
            StateProj::Refused { open } => {
                let Some(open) = open.take() else {
                    tower_once_core::polled_after_completion("CircuitBreaker's ResponseFuture");
                };
                // NOTE: a RetryLayer polling this attempt learns that it was never sent, and
                // when the circuit admits a probe.
                tower_once_core::attempt::refuse(open.refused());
                Poll::Ready(Err(open.into()))
            }
        }
    }
}
