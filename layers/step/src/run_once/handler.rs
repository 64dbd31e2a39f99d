//! The handler as the step mechanism calls it: its answer a [`RunOnceOutcome`], its deadline
//! back in scope, its error never "unsent"; and the record of a done run, which holds nothing.

use super::error::RunOnceError;
use super::outcome::RunOnceOutcome;
use super::Delivery;
use crate::codec::Codec;
use pin_project_lite::pin_project;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use tower_once_core::unsent::Unsent;
use tower_once_idempotency::store::StoredResponse;
use tower_service::Service;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The future of [`RunOnce`](super::RunOnce).
///
/// NOTE: boxed once per message, as a step's is. A run is two store round trips (claim,
/// record) and the consumer's acknowledgement; the box is one allocation among theirs.
pub struct ResponseFuture<R, E> {
    inner: Pin<Box<dyn Future<Output = Answer<R, E>> + Send>>,
}

/// What a run-once future yields.
type Answer<R, E> = Result<RunOnceOutcome<R>, RunOnceError<E>>;

impl<R, E> ResponseFuture<R, E> {
    pub(super) fn new(future: impl Future<Output = Answer<R, E>> + Send + 'static) -> Self {
        Self {
            inner: Box::pin(future),
        }
    }
}

impl<R, E> Future for ResponseFuture<R, E> {
    type Output = Answer<R, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}

impl<R, E> fmt::Debug for ResponseFuture<R, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

/// The handler's error: a run that failed may have done anything, so it is never "unsent"
/// (a run-once policy runs it again either way).
pub(super) struct Failed<E>(pub(super) E);

impl<E> Unsent for Failed<E> {
    fn is_unsent(&self) -> bool {
        false
    }
}

/// The handler, answering [`RunOnceOutcome::Done`].
pub(super) struct Handler<S>(pub(super) S);

impl<S, Req> Service<Req> for Handler<S>
where
    S: Service<Req>,
    Req: Delivery,
{
    type Response = RunOnceOutcome<S::Response>;
    type Error = Failed<S::Error>;
    type Future = Ran<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx).map_err(Failed)
    }

    fn call(&mut self, message: Req) -> Self::Future {
        // The handler is called after the claim, outside the consumer's `call`: its deadline
        // is put back in scope so a `TimeoutLayer`/`RetryLayer` inside still sees it.
        let future = match message.deadline() {
            Some(deadline) => deadline.scope(|| self.0.call(message)),
            None => self.0.call(message),
        };
        Ran { future }
    }
}

pin_project! {
    /// The handler's future, its answer a [`RunOnceOutcome`].
    pub(super) struct Ran<F> {
        #[pin]
        future: F,
    }
}

impl<F, R, E> Future for Ran<F>
where
    F: Future<Output = Result<R, E>>,
{
    type Output = Result<RunOnceOutcome<R>, Failed<E>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.project()
            .future
            .poll(cx)
            .map(|result| result.map(RunOnceOutcome::Done).map_err(Failed))
    }
}

/// A done run's record: nothing but that it is done. Read back, any record is a duplicate.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Nothing;

impl<R> Codec<RunOnceOutcome<R>> for Nothing {
    fn encode(&self, _: &RunOnceOutcome<R>) -> Result<StoredResponse, BoxError> {
        Ok(StoredResponse::new(
            http::StatusCode::OK,
            http::HeaderMap::new(),
            bytes::Bytes::new(),
        ))
    }

    fn decode(&self, _: &StoredResponse) -> Result<RunOnceOutcome<R>, BoxError> {
        Ok(RunOnceOutcome::Duplicate)
    }
}
