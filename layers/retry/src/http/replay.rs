//! A request that can be sent again, and the service that rebuilds it for each attempt.

use bytes::Bytes;
use http::{Extensions, HeaderMap, Method, Request, Uri, Version};
use http_body::Body;
use std::marker::PhantomData;
use std::task::{Context, Poll};
use tower_once_core::body::BufferedBody;
use tower_once_core::carrier::Carrier;
use tower_service::Service;

/// A request in a form that can be sent again: its parts and its whole body.
#[derive(Debug, Clone)]
pub struct ReplayRequest {
    pub(super) method: Method,
    pub(super) uri: Uri,
    pub(super) version: Version,
    pub(super) headers: HeaderMap,
    pub(super) extensions: Extensions,
    pub(super) body: Bytes,
}

impl Carrier for ReplayRequest {
    fn extensions(&self) -> Option<&Extensions> {
        Some(&self.extensions)
    }

    fn extensions_mut(&mut self) -> Option<&mut Extensions> {
        Some(&mut self.extensions)
    }
}

impl ReplayRequest {
    pub(super) fn into_request<B: Body>(self, body: ReplayBody<B>) -> Request<ReplayBody<B>> {
        let mut req = Request::new(body);
        *req.method_mut() = self.method;
        *req.uri_mut() = self.uri;
        *req.version_mut() = self.version;
        *req.headers_mut() = self.headers;
        *req.extensions_mut() = self.extensions;
        req
    }
}

/// Turns each attempt's [`ReplayRequest`] back into an `http::Request`; its extensions carry
/// the attempt's mark and deadline.
pub struct Rebuild<S, B> {
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

impl<S: std::fmt::Debug, B> std::fmt::Debug for Rebuild<S, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rebuild")
            .field("inner", &self.inner)
            .finish()
    }
}

impl<S, B> Service<ReplayRequest> for Rebuild<S, B>
where
    B: Body,
    S: Service<Request<ReplayBody<B>>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut replay: ReplayRequest) -> S::Future {
        // The attempt's mark and deadline are in `replay.extensions` already (see `mark`).
        let body = ReplayBody::full(std::mem::take(&mut replay.body));
        self.inner.call(replay.into_request(body))
    }
}

/// The request body the inner service receives from [`HttpRetry`](super::HttpRetry): the buffered bytes
/// (replayable, [`full`](BufferedBody::full)), the original body for a request sent once
/// ([`streaming`](BufferedBody::streaming), [`prefixed`](BufferedBody::prefixed) when part of
/// it was read), or the bytes read and then the error of a body that failed while buffering
/// ([`failed`](BufferedBody::failed)).
pub type ReplayBody<B> = BufferedBody<B>;
