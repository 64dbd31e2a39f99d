use crate::attempt::{in_attempt, mark};
use crate::classify::Classify;
use crate::error::{GiveUp, RetryError};
use crate::hook::OnRetry;
use crate::operation::Operation;
use pin_project_lite::pin_project;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use tokio::time::{Instant, Sleep};
use tower_once_core::carrier::Carrier;
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
    Req: Clone + Carrier,
    C: Classify<S::Response, S::Error>,
    H: OnRetry<S::Response, S::Error>,
{
    type Output = Result<S::Response, RetryError<S::Error>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let Some(op) = this.operation.as_mut() else {
            panic!("ResponseFuture polled after completion");
        };
        // NOTE: the operation's clock and deadline start at its first poll; after it, the
        // deadline in scope while the caller polls (`Deadline::in_scope`, or an outer retry's
        // attempt polling this future across a `Buffer`) bounds the operation too.
        if !op.has_begun() {
            op.begin();
        } else if let Some(deadline) = op.tighten() {
            if let (Some(timer), false) = (
                this.timer.as_mut().as_pin_mut(),
                matches!(*this.state, State::Waiting),
            ) {
                timer.reset(deadline.instant());
            }
        }
        loop {
            let Some(op) = this.operation.as_mut() else {
                panic!("ResponseFuture polled after completion");
            };
            match this.state.as_mut().project() {
                StateProj::Calling { future } => {
                    // NOTE: polled inside the attempt's scope too, so that an inner RetryLayer
                    // or TimeoutLayer reached from this future (an `async` block, a
                    // `oneshot`, a `Buffer`'s future) sees the operation.
                    let deadline = op.deadline();
                    let (poll, refused) = in_attempt(op.mark(), deadline, || future.poll(cx));
                    op.note_refusal(refused);
                    let Poll::Ready(outcome) = poll else {
                        return cut_off(this.timer.as_mut(), this.operation, this.state, cx);
                    };
                    if let (true, Some(refused)) = (op.nested, op.refused) {
                        // The outer retry does the retrying: it needs to know too.
                        tower_once_core::attempt::refuse(refused);
                    }
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
                            // NOTE: an "in progress" answer is not the operation's outcome:
                            // giving up on it says the operation may still complete.
                            let result = if op.in_progress && reason != GiveUp::NotRetryable {
                                Err(op.error(reason, None))
                            } else {
                                outcome.map_err(|e| op.error(reason, Some(e)))
                            };
                            *this.operation = None;
                            this.state.set(State::Done);
                            return Poll::Ready(result);
                        }
                    }
                }
                StateProj::Waiting => {
                    if let Some(mut timer) = this.timer.as_mut().as_pin_mut() {
                        // NOTE: no backoff past the deadline: one that moved earlier while
                        // waiting (see `tighten`) may now end before the wait does.
                        if timer.deadline() >= op.deadline().instant() {
                            op.give_up(GiveUp::Deadline);
                            return Poll::Ready(Err(finish_early(this.operation, this.state)));
                        }
                        ready!(timer.as_mut().poll(cx));
                        // Back to guarding the deadline for the next attempt.
                        timer.reset(op.deadline().instant());
                    }
                    this.state.set(State::Readying);
                }
                StateProj::Readying => {
                    // NOTE: no attempt once the deadline has passed.
                    if op.is_expired() {
                        op.give_up(GiveUp::Deadline);
                        return Poll::Ready(Err(finish_early(this.operation, this.state)));
                    }
                    // In the deadline's scope: a service that waits to be ready (a gated circuit
                    // breaker) knows how long it may.
                    let deadline = op.deadline();
                    let service = &mut op.service;
                    let ready = deadline.scope(|| service.poll_ready(cx));
                    let Poll::Ready(ready) = ready else {
                        return cut_off(this.timer.as_mut(), this.operation, this.state, cx);
                    };
                    if let Err(e) = ready {
                        let error = op.error(GiveUp::NotRetryable, Some(e));
                        *this.operation = None;
                        this.state.set(State::Done);
                        return Poll::Ready(Err(error));
                    }
                    op.attempt += 1;
                    if !op.nested {
                        op.config.settings.stats.attempt();
                    }
                    let mut request = op.request.clone();
                    let (attempt, deadline) = (op.mark(), op.deadline());
                    mark(&mut request, attempt, deadline);
                    let service = &mut op.service;
                    let (future, refused) = in_attempt(attempt, deadline, || service.call(request));
                    op.refused = refused;
                    this.state.set(State::Calling { future });
                }
                StateProj::Done => panic!("ResponseFuture polled after completion"),
            }
        }
    }
}

/// Ends the operation at its deadline, without an attempt's outcome.
fn finish_early<S, Req, C, H, F, E>(
    operation: &mut Option<Operation<S, Req, C, H>>,
    mut state: Pin<&mut State<F>>,
) -> RetryError<E> {
    let error = match operation.take() {
        Some(op) => op.error(GiveUp::Deadline, None),
        None => RetryError::deadline(0),
    };
    state.set(State::Done);
    error
}

/// An attempt (or the service's readiness) is pending: ends the operation if its deadline has
/// passed, else waits for whichever comes first.
fn cut_off<S, Req, C, H, F, T, E>(
    mut cutoff: Pin<&mut Option<Sleep>>,
    operation: &mut Option<Operation<S, Req, C, H>>,
    state: Pin<&mut State<F>>,
    cx: &mut Context<'_>,
) -> Poll<Result<T, RetryError<E>>> {
    let Some(op) = operation.as_ref() else {
        return Poll::Pending;
    };
    if cutoff.is_none() {
        cutoff.set(Some(tokio::time::sleep_until(op.deadline().instant())));
    }
    let Some(timer) = cutoff.as_pin_mut() else {
        return Poll::Pending;
    };
    ready!(timer.poll(cx));
    tracing::debug!(attempts = op.attempt, "deadline passed mid-attempt");
    op.give_up(GiveUp::Deadline);
    Poll::Ready(Err(finish_early(operation, state)))
}
