//! The response future: buffering the body, then one attempt or a retried operation.

use super::replay::{Rebuild, ReplayBody, ReplayRequest};
use crate::attempt::call_once;
use crate::classify::Classify;
use crate::config::SharedConfig;
use crate::error::{GiveUp, RetryError};
use crate::hook::OnRetry;
use crate::operation::Operation;
use bytes::Bytes;
use http::{HeaderValue, Request, Response};
use http_body::Body;
use pin_project_lite::pin_project;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use tokio::time::{Instant, Sleep};
use tower_once_core::body::{Collected, Collector};
use tower_once_timeout::Deadline;
use tower_service::Service;

/// What an operation needs once its request body is buffered.
pub(super) struct Pending<S, C, H> {
    pub(super) service: S,
    pub(super) template: ReplayRequest,
    pub(super) config: SharedConfig<C, H>,
    pub(super) limit: usize,
    pub(super) deadline: Deadline,
}

type Core<S, B, C, H> = crate::ResponseFuture<Rebuild<S, B>, ReplayRequest, C, H>;

pin_project! {
    /// Response future of [`HttpRetry`].
    pub struct ResponseFuture<S, B, C, H>
    where
        B: Body,
        S: Service<Request<ReplayBody<B>>>,
    {
        #[pin]
        state: HttpState<S::Future, B, Core<S, B, C, H>>,
        // The operation's deadline while the request body is being buffered.
        #[pin]
        cutoff: Option<Sleep>,
        pending: Option<Pending<S, C, H>>,
        // For the error: the key every attempt carried, and when the operation was called.
        key: Option<HeaderValue>,
        started: Instant,
    }
}

pin_project! {
    #[project = HttpStateProj]
    enum HttpState<F, B, R> {
        Buffering { body: Option<Pin<Box<B>>>, collected: Collector },
        Retrying { #[pin] core: R },
        // One attempt, still bound by the operation's deadline.
        Once { #[pin] future: F, #[pin] cutoff: Sleep },
    }
}

impl<S, B, C, H> ResponseFuture<S, B, C, H>
where
    B: Body,
    S: Service<Request<ReplayBody<B>>>,
{
    pub(super) fn once(future: S::Future, deadline: Deadline, started: Started) -> Self {
        Self {
            state: HttpState::Once {
                future,
                cutoff: tokio::time::sleep_until(deadline.instant()),
            },
            cutoff: None,
            pending: None,
            key: started.key,
            started: started.at,
        }
    }

    pub(super) fn buffering(body: B, pending: Pending<S, C, H>, started: Started) -> Self {
        Self {
            state: HttpState::Buffering {
                body: Some(Box::pin(body)),
                collected: Collector::default(),
            },
            cutoff: None,
            pending: Some(pending),
            key: started.key,
            started: started.at,
        }
    }

    pub(super) fn retrying(core: Core<S, B, C, H>, started: Started) -> Self {
        Self {
            state: HttpState::Retrying { core },
            cutoff: None,
            pending: None,
            key: started.key,
            started: started.at,
        }
    }
}

/// What the error of an operation needs from its start: the key its attempts carry and the
/// clock when it was called.
pub(super) struct Started {
    pub(super) key: Option<HeaderValue>,
    pub(super) at: Instant,
}

impl<S, B, C, H> ResponseFuture<S, B, C, H>
where
    B: Body,
    S: Service<Request<ReplayBody<B>>>,
{
    /// The operation's error, with the key its attempts carried.
    fn error<E>(key: &Option<HeaderValue>, error: RetryError<E>) -> RetryError<E> {
        match key.as_ref().and_then(|k| k.to_str().ok()) {
            Some(key) => error.with_idempotency_key(key),
            None => error,
        }
    }
}

impl<S, B, ResB, C, H> Future for ResponseFuture<S, B, C, H>
where
    S: Service<Request<ReplayBody<B>>, Response = Response<ResB>>,
    B: Body<Data = Bytes>,
    C: Classify<Response<ResB>, S::Error>,
    H: OnRetry<Response<ResB>, S::Error>,
{
    type Output = Result<Response<ResB>, RetryError<S::Error>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                HttpStateProj::Retrying { core } => {
                    let result = ready!(core.poll(cx));
                    return Poll::Ready(result.map_err(|e| Self::error(this.key, e)));
                }
                HttpStateProj::Once { future, mut cutoff } => {
                    let elapsed = || this.started.elapsed();
                    if let Poll::Ready(outcome) = future.poll(cx) {
                        return Poll::Ready(outcome.map_err(|e| {
                            let error = RetryError::new(GiveUp::NotRetryable, 1, e);
                            Self::error(this.key, error.with_elapsed(elapsed()))
                        }));
                    }
                    // The deadline in scope while the caller polls bounds this attempt too.
                    if let Some(current) = Deadline::current() {
                        if current.instant() < cutoff.deadline() {
                            cutoff.as_mut().reset(current.instant());
                        }
                    }
                    ready!(cutoff.poll(cx));
                    let error = RetryError::deadline(1).with_elapsed(elapsed());
                    return Poll::Ready(Err(Self::error(this.key, error)));
                }
                HttpStateProj::Buffering { body, collected } => {
                    let (Some(stream), Some(pending)) = (body.as_mut(), this.pending.as_ref())
                    else {
                        panic!("ResponseFuture polled after completion");
                    };
                    // Request trailers are not replayed.
                    let mut trailers = None;
                    let Poll::Ready(outcome) =
                        collected.poll_collect(stream.as_mut(), pending.limit, &mut trailers, cx)
                    else {
                        // A request body that stalls is still inside the deadline.
                        if this.cutoff.is_none() {
                            let until = pending.deadline.instant();
                            this.cutoff.set(Some(tokio::time::sleep_until(until)));
                        }
                        if let Some(cutoff) = this.cutoff.as_mut().as_pin_mut() {
                            ready!(cutoff.poll(cx));
                        }
                        *this.pending = None;
                        body.take();
                        let error = RetryError::deadline(0).with_elapsed(this.started.elapsed());
                        return Poll::Ready(Err(Self::error(this.key, error)));
                    };
                    let Some(Pending {
                        service,
                        template,
                        config,
                        deadline,
                        ..
                    }) = this.pending.take()
                    else {
                        panic!("ResponseFuture polled after completion");
                    };
                    let collected = std::mem::take(collected);
                    let once = |body: ReplayBody<B>, service: S, template: ReplayRequest| {
                        let stats = &config.settings.stats;
                        stats.operation();
                        stats.attempt();
                        call_once(service, template.into_request(body), deadline)
                    };
                    match (outcome, body.take()) {
                        (Collected::Complete, _) => {
                            let replay = ReplayRequest {
                                body: collected.finish(),
                                ..template
                            };
                            this.state.set(HttpState::Retrying {
                                core: crate::ResponseFuture::new(Operation::start(
                                    Rebuild::new(service),
                                    replay,
                                    config,
                                    Some(deadline),
                                    false,
                                )),
                            });
                        }
                        (Collected::Over(data), Some(rest)) => {
                            tracing::debug!("request body over the replay limit: one attempt");
                            let body = ReplayBody::prefixed(collected.finish_with(data), rest);
                            let future = once(body, service, template);
                            this.state.set(HttpState::Once {
                                future,
                                cutoff: tokio::time::sleep_until(deadline.instant()),
                            });
                        }
                        (Collected::Failed(error), _) => {
                            // NOTE: never pass a truncated body off as complete, nor replay it:
                            // the inner service sees the bytes read so far, then the error.
                            tracing::debug!("request body failed while buffering: one attempt");
                            let body = ReplayBody::failed(collected.finish(), error);
                            let future = once(body, service, template);
                            this.state.set(HttpState::Once {
                                future,
                                cutoff: tokio::time::sleep_until(deadline.instant()),
                            });
                        }
                        (Collected::Over(_), None) => {
                            panic!("ResponseFuture polled after completion")
                        }
                    }
                }
            }
        }
    }
}
