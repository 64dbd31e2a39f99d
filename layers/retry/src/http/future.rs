//! The response future: reading the body, then one attempt or a retried operation.

use super::replay::Rebuild;
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
use tower_once_core::body::BufferedBody;
use tower_once_core::replay::{Read, ReadForReplay, ReplayRequest};
use tower_once_timeout::Deadline;
use tower_service::Service;

/// What an operation needs once its request body is read.
pub(super) struct Pending<S, C, H> {
    pub(super) service: S,
    pub(super) config: SharedConfig<C, H>,
    pub(super) deadline: Deadline,
}

type Core<S, B, C, H> = crate::ResponseFuture<Rebuild<S, B>, ReplayRequest, C, H>;

pin_project! {
    /// Response future of [`HttpRetry`].
    pub struct ResponseFuture<S, B, C, H>
    where
        B: Body,
        S: Service<Request<BufferedBody<B>>>,
    {
        #[pin]
        state: HttpState<S::Future, ReadForReplay<B>, Core<S, B, C, H>>,
        pending: Option<Pending<S, C, H>>,
        // For the error: the key every attempt carried, and when the operation was called.
        key: Option<HeaderValue>,
        started: Instant,
    }
}

pin_project! {
    #[project = HttpStateProj]
    enum HttpState<F, Rd, R> {
        // The body, read so that it can be sent again, within the operation's deadline.
        Reading { #[pin] read: Rd },
        Retrying { #[pin] core: R },
        // One attempt, still bound by the operation's deadline.
        Once { #[pin] future: F, #[pin] cutoff: Sleep },
        // The deadline passed before the one attempt could start: nothing was sent.
        Expired,
        Done,
    }
}

impl<S, B, C, H> ResponseFuture<S, B, C, H>
where
    B: Body,
    S: Service<Request<BufferedBody<B>>>,
{
    pub(super) fn once(future: S::Future, deadline: Deadline, started: Started) -> Self {
        Self {
            state: HttpState::Once {
                future,
                cutoff: tokio::time::sleep_until(deadline.instant()),
            },
            pending: None,
            key: started.key,
            started: started.at,
        }
    }

    /// The deadline passed before the request could be sent: nothing is.
    pub(super) fn expired(started: Started) -> Self {
        Self {
            state: HttpState::Expired,
            pending: None,
            key: started.key,
            started: started.at,
        }
    }

    pub(super) fn reading(
        read: ReadForReplay<B>,
        pending: Pending<S, C, H>,
        started: Started,
    ) -> Self {
        Self {
            state: HttpState::Reading { read },
            pending: Some(pending),
            key: started.key,
            started: started.at,
        }
    }

    pub(super) fn retrying(core: Core<S, B, C, H>, started: Started) -> Self {
        Self {
            state: HttpState::Retrying { core },
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
    S: Service<Request<BufferedBody<B>>>,
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
    S: Service<Request<BufferedBody<B>>, Response = Response<ResB>>,
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
                HttpStateProj::Expired => {
                    this.state.set(HttpState::Done);
                    let error = RetryError::deadline(0).with_elapsed(this.started.elapsed());
                    return Poll::Ready(Err(Self::error(this.key, error)));
                }
                HttpStateProj::Done => {
                    tower_once_core::polled_after_completion("HttpRetry's ResponseFuture")
                }
                HttpStateProj::Reading { read } => {
                    let read = ready!(read.poll(cx));
                    let Some(Pending {
                        service,
                        config,
                        deadline,
                    }) = this.pending.take()
                    else {
                        tower_once_core::polled_after_completion("HttpRetry's ResponseFuture");
                    };
                    let req = match read {
                        Read::Whole(replay) => {
                            this.state.set(HttpState::Retrying {
                                core: crate::ResponseFuture::new(Operation::start(
                                    Rebuild::new(service),
                                    replay,
                                    config,
                                    Some(deadline),
                                    false,
                                )),
                            });
                            continue;
                        }
                        // NOTE: a body that passed the limit or failed just as the deadline
                        // came is not sent at the deadline either.
                        Read::Once(_) if deadline.is_expired() => {
                            let error =
                                RetryError::deadline(0).with_elapsed(this.started.elapsed());
                            return Poll::Ready(Err(Self::error(this.key, error)));
                        }
                        Read::Once(req) => req,
                        Read::Elapsed(_) => {
                            let error =
                                RetryError::deadline(0).with_elapsed(this.started.elapsed());
                            return Poll::Ready(Err(Self::error(this.key, error)));
                        }
                    };
                    let stats = &config.settings.stats;
                    stats.operation();
                    stats.attempt();
                    this.state.set(HttpState::Once {
                        future: call_once(service, req, deadline),
                        cutoff: tokio::time::sleep_until(deadline.instant()),
                    });
                }
            }
        }
    }
}
