//! The service that turns each attempt's [`ReplayRequest`] back into an `http::Request`.

use http::Request;
use http_body::Body;
use std::marker::PhantomData;
use std::task::{Context, Poll};
use tower_once_core::body::BufferedBody;
use tower_once_core::replay::ReplayRequest;
use tower_service::Service;

/// Turns each attempt's [`ReplayRequest`] back into an `http::Request`; its extensions carry
/// the attempt's mark and deadline.
pub(crate) struct Rebuild<S, B> {
    inner: S,
    _body: PhantomData<fn(B)>,
}

impl<S, B> Rebuild<S, B> {
    pub(super) fn new(inner: S) -> Self {
        Self {
            inner,
            _body: PhantomData,
        }
    }
}

impl<S: Clone, B> Clone for Rebuild<S, B> {
    fn clone(&self) -> Self {
        Self::new(self.inner.clone())
    }
}

impl<S, B> Service<ReplayRequest> for Rebuild<S, B>
where
    B: Body,
    S: Service<Request<BufferedBody<B>>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, replay: ReplayRequest) -> S::Future {
        // The attempt's mark and deadline are in the replay's extensions already.
        self.inner.call(replay.into_request())
    }
}
