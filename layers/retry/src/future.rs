use crate::attempt::in_attempt;
use crate::classify::Classify;
use crate::error::{GiveUp, RetryError};
use crate::hook::OnRetry;
use crate::operation::Operation;
use pin_project_lite::pin_project;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use tokio::time::{Instant, Sleep};
use tower_once_core::time::saturating_add;
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
