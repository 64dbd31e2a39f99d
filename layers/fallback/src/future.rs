//! The response future: the primary's outcome, then, when the rule allows it, the secondary's.

use crate::config::Config;
use crate::error::FallbackError;
use crate::hook::{FallbackEvent, OnFallback};
use crate::rule::{decide, Facts};
use pin_project_lite::pin_project;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use tokio::time::Sleep;
use tower_once_core::attempt::CopyWatch;
use tower_once_core::classify::{Action, Classify};
use tower_once_core::shard::Padded;
use tower_once_core::unsent::Unsent;
use tower_once_timeout::Deadline;
use tower_service::Service;

/// What a request needs to go to the secondary: a copy of it, and what it says of itself.
pub(crate) struct Held<Req> {
    pub(crate) request: Req,
    pub(crate) facts: Facts,
}

pin_project! {
    /// Response future of [`Fallback`](crate::Fallback).
    pub struct ResponseFuture<PF, T, Req, C, H>
    where
        PF: Future,
        T: Service<Req>,
    {
        #[pin]
        state: State<PF, T::Future>,
        // The operation's deadline, armed while the secondary runs.
        #[pin]
        cutoff: Option<Sleep>,
        deadline: Option<Deadline>,
        held: Option<Held<Req>>,
        secondary: Option<T>,
        // Through which a hedge below on another task says it sent a copy.
        watch: Option<CopyWatch>,
        // The primary's failure, until the secondary is called: the answer if it never is.
        primary: Option<PF::Output>,
        config: Arc<Padded<Config<T, C, H>>>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<PF, SF> {
        Primary { #[pin] future: PF },
        Readying,
        Secondary { #[pin] future: SF },
        Done,
    }
}

impl<PF, T, Req, C, H> ResponseFuture<PF, T, Req, C, H>
where
    PF: Future,
    T: Service<Req>,
{
    pub(crate) fn new(
        primary: PF,
        held: Held<Req>,
        watch: Option<CopyWatch>,
        deadline: Option<Deadline>,
        config: Arc<Padded<Config<T, C, H>>>,
    ) -> Self {
        Self {
            state: State::Primary { future: primary },
            cutoff: None,
            deadline,
            held: Some(held),
            secondary: None,
            watch,
            primary: None,
            config,
        }
    }
}

impl<PF, T, Req, Res, PE, C, H> Future for ResponseFuture<PF, T, Req, C, H>
where
    PF: Future<Output = Result<Res, PE>>,
    PE: Unsent,
    T: Service<Req, Response = Res> + Clone,
    C: Classify<Res, PE>,
    H: OnFallback<Res, PE>,
{
    type Output = Result<Res, FallbackError<PE, T::Error>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let deadline = *this.deadline;
        loop {
            match this.state.as_mut().project() {
                StateProj::Primary { future } => {
                    let (poll, copied) = tower_once_core::attempt::watch_copies(|| {
                        in_scope(deadline, || future.poll(cx))
                    });
                    let copied = copied || this.watch.as_ref().is_some_and(CopyWatch::copied);
                    if copied {
                        // NOTE: a hedge below sent another copy: the primary's error no longer
                        // speaks for the first one, which may have run.
                        if let Some(held) = this.held.as_mut() {
                            held.facts.later_attempt = true;
                        }
                    }
                    let outcome = ready!(poll);
                    let config = &this.config.0;
                    let sent = match config.classifier.classify(&outcome) {
                        Action::Retry { .. } => {
                            outcome.as_ref().err().is_none_or(|e| !e.is_unsent())
                        }
                        // "Still running": it certainly was sent.
                        Action::InProgress { .. } => true,
                        _ => {
                            this.state.set(State::Done);
                            return Poll::Ready(outcome.map_err(FallbackError::primary));
                        }
                    };
                    let reason = match this.held.as_ref() {
                        // NOTE: no time left, no fallback: the primary's outcome is the answer.
                        _ if deadline.is_some_and(Deadline::is_expired) => None,
                        Some(held) => decide(!sent, held.facts, config.safety),
                        None => None,
                    };
                    let Some(reason) = reason else {
                        if !deadline.is_some_and(Deadline::is_expired) {
                            crate::metrics::withheld();
                            tracing::debug!(
                                "primary failed and the request may have run there: no fallback"
                            );
                        }
                        this.state.set(State::Done);
                        return Poll::Ready(outcome.map_err(FallbackError::primary));
                    };
                    tower_once_core::hook::call("fallback", || {
                        config.hook.on_fallback(&FallbackEvent {
                            reason,
                            primary: &outcome,
                        })
                    });
                    crate::metrics::fallback(reason);
                    tracing::info!(reason = reason.as_str(), "primary failed: to the secondary");
                    // NOTE: the primary's circuit may have reported a refusal to a retry layer
                    // above; the outcome now is the secondary's.
                    tower_once_core::attempt::withdraw_refusal();
                    *this.primary = Some(outcome);
                    *this.secondary = Some(config.secondary.clone());
                    if let Some(deadline) = deadline {
                        this.cutoff
                            .set(Some(tokio::time::sleep_until(deadline.instant())));
                    }
                    this.state.set(State::Readying);
                }
                StateProj::Readying => {
                    let Some(secondary) = this.secondary.as_mut() else {
                        tower_once_core::polled_after_completion("Fallback's ResponseFuture");
                    };
                    let ready = secondary.poll_ready(cx);
                    // NOTE: a refusal the secondary reports is not the attempt's above: the
                    // primary was sent (or the rule allowed this for another reason).
                    tower_once_core::attempt::withdraw_refusal();
                    let expired = deadline.is_some_and(Deadline::is_expired);
                    let ready = match ready {
                        // NOTE: nothing goes to the secondary once the deadline has passed;
                        // the primary's outcome is the answer.
                        _ if expired => return Poll::Ready(finish(this.primary, this.state)),
                        Poll::Pending => {
                            // The deadline's timer wakes this while the secondary is not ready.
                            if let Some(timer) = this.cutoff.as_mut().as_pin_mut() {
                                if timer.poll(cx).is_ready() {
                                    return Poll::Ready(finish(this.primary, this.state));
                                }
                            }
                            return Poll::Pending;
                        }
                        Poll::Ready(ready) => ready,
                    };
                    let (Some(held), Some(mut secondary)) =
                        (this.held.take(), this.secondary.take())
                    else {
                        tower_once_core::polled_after_completion("Fallback's ResponseFuture");
                    };
                    if let Err(e) = ready {
                        this.state.set(State::Done);
                        return Poll::Ready(Err(FallbackError::secondary(e)));
                    }
                    *this.primary = None;
                    let future = in_scope(deadline, || secondary.call(held.request));
                    tower_once_core::attempt::withdraw_refusal();
                    this.state.set(State::Secondary { future });
                }
                StateProj::Secondary { future } => {
                    let poll = in_scope(deadline, || future.poll(cx));
                    tower_once_core::attempt::withdraw_refusal();
                    if let Poll::Ready(outcome) = poll {
                        this.state.set(State::Done);
                        return Poll::Ready(outcome.map_err(FallbackError::secondary));
                    }
                    return cut_off(this.cutoff.as_mut(), this.state.as_mut(), cx);
                }
                StateProj::Done => {
                    tower_once_core::polled_after_completion("Fallback's ResponseFuture")
                }
            }
        }
    }
}

/// Ends the operation with the primary's outcome (the secondary never got the request).
fn finish<PF, SF, Res, PE, SE>(
    primary: &mut Option<Result<Res, PE>>,
    mut state: Pin<&mut State<PF, SF>>,
) -> Result<Res, FallbackError<PE, SE>> {
    state.set(State::Done);
    match primary.take() {
        Some(outcome) => outcome.map_err(FallbackError::primary),
        None => Err(FallbackError::deadline()),
    }
}

/// Runs `f` inside the deadline's scope, when there is one.
fn in_scope<R>(deadline: Option<Deadline>, f: impl FnOnce() -> R) -> R {
    match deadline {
        Some(deadline) => deadline.scope(f),
        None => f(),
    }
}

/// The secondary is pending: ends the operation if its deadline has passed.
fn cut_off<PF, SF, R, PE, SE>(
    cutoff: Pin<&mut Option<Sleep>>,
    mut state: Pin<&mut State<PF, SF>>,
    cx: &mut Context<'_>,
) -> Poll<Result<R, FallbackError<PE, SE>>> {
    let Some(timer) = cutoff.as_pin_mut() else {
        return Poll::Pending;
    };
    ready!(timer.poll(cx));
    tracing::debug!("deadline passed while the secondary was running");
    state.set(State::Done);
    Poll::Ready(Err(FallbackError::deadline()))
}
