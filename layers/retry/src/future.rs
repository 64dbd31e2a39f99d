use crate::classify::{Action, Classify};
use crate::error::{GiveUp, RetryError};
use crate::hook::{OnRetry, RetryEvent};
use crate::layer::SharedConfig;
use crate::service::in_attempt;
use pin_project_lite::pin_project;
use std::future::Future;
use std::pin::Pin;
use std::sync::PoisonError;
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::time::{Instant, Sleep};
use tower_once_core::time::saturating_add;
use tower_once_timeout::Deadline;
use tower_service::Service;

pin_project! {
    /// Response future of [`Retry`](crate::Retry).
    pub struct ResponseFuture<S, Req, C, H>
    where
        S: Service<Req>,
    {
        #[pin]
        state: State<S::Future>,
        // One timer, armed only when needed: the operation's deadline while an attempt (or
        // readiness) is pending, so the layer ends the operation at its deadline whatever sits
        // below it; the wait before a retry while `Waiting` (which ends before the deadline).
        #[pin]
        timer: Option<Sleep>,
        operation: Option<Operation<S, Req, C, H>>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        Calling { #[pin] future: F },
        Waiting,
        Readying,
        Done,
    }
}

/// Everything one logical operation needs between attempts.
pub(crate) struct Operation<S, Req, C, H> {
    pub(crate) service: S,
    pub(crate) request: Req,
    pub(crate) config: SharedConfig<C, H>,
    pub(crate) deadline: Deadline,
    pub(crate) attempt: u32,
    /// Inside another retry layer's attempt: one attempt, bound by this layer's own deadline
    /// when it is the shorter; the outer layer does the retrying.
    pub(crate) nested: bool,
    pub(crate) previous_delay: Duration,
    /// Made on the first jittered wait: most operations never need one.
    pub(crate) rng: Option<fastrand::Rng>,
}

impl<S, Req, C, H> ResponseFuture<S, Req, C, H>
where
    S: Service<Req>,
{
    /// The operation starts by waiting for the service to be ready, under its deadline.
    pub(crate) fn new(operation: Operation<S, Req, C, H>) -> Self {
        Self {
            state: State::Readying,
            timer: None,
            operation: Some(operation),
        }
    }
}

impl<S, Req, C, H> Operation<S, Req, C, H>
where
    S: Service<Req>,
    C: Classify<S::Response, S::Error>,
    H: OnRetry<S::Response, S::Error>,
{
    /// The wait before the next attempt, or why there is none.
    fn next_delay(&mut self, outcome: &Result<S::Response, S::Error>) -> Result<Duration, GiveUp> {
        let settings = &self.config.settings;
        if self.nested {
            return Err(GiveUp::NotRetryable);
        }
        let after = match self.config.classifier.classify(outcome) {
            Action::Success | Action::Stop => return Err(GiveUp::NotRetryable),
            Action::Retry { after } => after,
        };
        let give_up = |reason: GiveUp| {
            settings.stats.give_up(reason);
            tracing::debug!(
                attempts = self.attempt,
                reason = reason.as_str(),
                "giving up"
            );
            Err(reason)
        };
        if self.attempt >= settings.max_attempts {
            return give_up(GiveUp::Exhausted);
        }
        let (delay, from_server) = match after {
            Some(after) => (after.min(settings.retry_after_cap), true),
            None => {
                let rng = self.rng.get_or_insert_with(|| match &settings.rng {
                    Some(seeded) => seeded.lock().unwrap_or_else(PoisonError::into_inner).fork(),
                    None => fastrand::Rng::new(),
                });
                let delay = settings
                    .backoff
                    .delay(self.attempt, self.previous_delay, rng);
                (delay, false)
            }
        };
        // NOTE: never sleep in vain: a wait that ends at or past the deadline leaves no time
        // for the attempt after it, so stop now with what we have.
        if Instant::now()
            .checked_add(delay)
            .is_none_or(|end| end >= self.deadline.instant())
        {
            return give_up(GiveUp::Deadline);
        }
        if let Some(budget) = &settings.budget {
            if !budget.withdraw() {
                settings.stats.budget_refusal();
                return give_up(GiveUp::Budget);
            }
        }
        settings.stats.retry(delay);
        self.config.hook.on_retry(&RetryEvent {
            attempt: self.attempt,
            delay,
            from_server,
            outcome,
        });
        tracing::info!(
            attempt = self.attempt,
            delay_ms = delay.as_millis() as u64,
            from_server,
            "retrying"
        );
        self.previous_delay = delay;
        Ok(delay)
    }
}

impl<S, Req, C, H> Future for ResponseFuture<S, Req, C, H>
where
    S: Service<Req>,
    Req: Clone,
    C: Classify<S::Response, S::Error>,
    H: OnRetry<S::Response, S::Error>,
{
    type Output = Result<S::Response, RetryError<S::Error>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            let Some(op) = this.operation.as_mut() else {
                panic!("ResponseFuture polled after completion");
            };
            match this.state.as_mut().project() {
                StateProj::Calling { future } => {
                    // NOTE: polled inside the attempt's scope too, so that an inner RetryLayer
                    // or TimeoutLayer reached from this future (an `async` block, a
                    // `oneshot`) sees the operation: see `service::in_attempt`.
                    let deadline = op.deadline;
                    let Poll::Ready(outcome) = in_attempt(deadline, || future.poll(cx)) else {
                        return cut_off(this.timer.as_mut(), this.operation, this.state, cx);
                    };
                    match op.next_delay(&outcome) {
                        Ok(delay) => {
                            let until = saturating_add(Instant::now(), delay);
                            match this.timer.as_mut().as_pin_mut() {
                                Some(timer) => timer.reset(until),
                                None => this.timer.set(Some(tokio::time::sleep_until(until))),
                            }
                            this.state.set(State::Waiting);
                        }
                        Err(reason) => {
                            let attempts = op.attempt;
                            *this.operation = None;
                            this.state.set(State::Done);
                            return Poll::Ready(
                                outcome.map_err(|e| RetryError::new(reason, attempts, e)),
                            );
                        }
                    }
                }
                StateProj::Waiting => {
                    if let Some(mut timer) = this.timer.as_mut().as_pin_mut() {
                        ready!(timer.as_mut().poll(cx));
                        // Back to guarding the deadline for the next attempt.
                        timer.reset(op.deadline.instant());
                    }
                    this.state.set(State::Readying);
                }
                StateProj::Readying => {
                    let Poll::Ready(ready) = op.service.poll_ready(cx) else {
                        return cut_off(this.timer.as_mut(), this.operation, this.state, cx);
                    };
                    if let Err(e) = ready {
                        let attempts = op.attempt;
                        *this.operation = None;
                        this.state.set(State::Done);
                        return Poll::Ready(Err(RetryError::new(
                            GiveUp::NotRetryable,
                            attempts,
                            e,
                        )));
                    }
                    op.attempt += 1;
                    if !op.nested {
                        op.config.settings.stats.attempt();
                    }
                    let request = op.request.clone();
                    let service = &mut op.service;
                    let future = in_attempt(op.deadline, || service.call(request));
                    this.state.set(State::Calling { future });
                }
                StateProj::Done => panic!("ResponseFuture polled after completion"),
            }
        }
    }
}

/// An attempt (or the service's readiness) is pending: ends the operation if its deadline has
/// passed, else waits for whichever comes first.
fn cut_off<S, Req, C, H, F, T, E>(
    mut cutoff: Pin<&mut Option<Sleep>>,
    operation: &mut Option<Operation<S, Req, C, H>>,
    mut state: Pin<&mut State<F>>,
    cx: &mut Context<'_>,
) -> Poll<Result<T, RetryError<E>>> {
    let Some(op) = operation.as_ref() else {
        return Poll::Pending;
    };
    if cutoff.is_none() {
        cutoff.set(Some(tokio::time::sleep_until(op.deadline.instant())));
    }
    let Some(timer) = cutoff.as_pin_mut() else {
        return Poll::Pending;
    };
    ready!(timer.poll(cx));
    let attempts = op.attempt;
    tracing::debug!(
        attempts,
        reason = GiveUp::Deadline.as_str(),
        "deadline passed mid-attempt; giving up"
    );
    op.config.settings.stats.give_up(GiveUp::Deadline);
    *operation = None;
    state.set(State::Done);
    Poll::Ready(Err(RetryError::deadline(attempts)))
}
