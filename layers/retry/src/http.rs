//! Retrying HTTP requests whose bodies are not `Clone`, safely.
//!
//! [`HttpRetryLayer`] is a [`RetryLayer`] for `http::Request`s, made with
//! [`RetryLayer::into_http`](crate::RetryLayer::into_http) (every retry setting carries over)
//! or [`HttpRetryLayer::new`] (the defaults with [`HttpClassifier`]). It classifies HTTP
//! responses with [`HttpClassifier`] unless another classifier was chosen with
//! [`classify`](HttpRetryLayer::classify), so `RetryLayer::new().into_http()` retries a `503`.
//! On top of the generic layer it:
//!
//! - **retries only safe requests**: idempotent methods (`GET`, `HEAD`, `OPTIONS`, `PUT`,
//!   `DELETE`, `TRACE`) and requests carrying an `Idempotency-Key`. Other requests get one
//!   attempt. With [`stamp_idempotency_keys`](HttpRetryLayer::stamp_idempotency_keys), an
//!   unkeyed `POST` or `PATCH` gets a fresh UUID key, the same on every attempt, and becomes
//!   retryable — the server's idempotency layer then runs it once;
//! - **buffers the body for replay**, up to [`body_limit`](HttpRetryLayer::body_limit)
//!   (64 KiB by default). A larger body is sent once, streaming, and that request is not
//!   retried: replaying it would need unbounded memory;
//! - **puts the operation's [`Deadline`] in each attempt's extensions**, for an
//!   `HttpTimeoutLayer` below and the transport.
//!
//! ```
//! use std::time::Duration;
//! use tower_once_retry::RetryLayer;
//!
//! let layer = RetryLayer::new()
//!     .deadline(Duration::from_secs(10))
//!     .into_http()
//!     .stamp_idempotency_keys(true);
//! // The same, built from the HTTP layer:
//! let same = tower_once_retry::http::HttpRetryLayer::new()
//!     .deadline(Duration::from_secs(10))
//!     .stamp_idempotency_keys(true);
//! # let _ = same;
//! # let _ = layer;
//! ```

use crate::backoff::Backoff;
use crate::budget::RetryBudget;
use crate::classify::{Classify, HttpClassifier, HttpDefault};
use crate::error::{GiveUp, RetryError};
use crate::hook::{OnRetry, StatsSnapshot};
use crate::layer::Config;
use crate::service::{in_attempt, is_nested, saturating_add, start, InAttempt};
use crate::RetryLayer;
use bytes::Bytes;
use http::{Extensions, HeaderMap, HeaderValue, Method, Request, Response, Uri, Version};
use http_body::Body;
use pin_project_lite::pin_project;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::time::Sleep;
use tower_layer::Layer;
use tower_once_core::body::{BufferedBody, Collected, Collector};
use tower_once_timeout::Deadline;
use tower_service::Service;

/// The `Idempotency-Key` header, checked and stamped by this layer.
pub use tower_once_core::IDEMPOTENCY_KEY;

/// The HTTP retry layer. See the [module docs](self).
#[derive(Clone)]
pub struct HttpRetryLayer<C = HttpClassifier, H = ()> {
    retry: RetryLayer<C, H>,
    body_limit: usize,
    stamp: bool,
}

impl HttpRetryLayer {
    /// [`RetryLayer::new`] with [`HttpClassifier`], a 64 KiB replay buffer, no key stamping.
    pub fn new() -> Self {
        RetryLayer::new().classify(HttpClassifier).into_http()
    }
}

impl Default for HttpRetryLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl<C, H> RetryLayer<C, H> {
    /// This layer for `http::Request`s with bodies that need not be `Clone`: see
    /// [`http`](crate::http).
    pub fn into_http(self) -> HttpRetryLayer<C, H> {
        HttpRetryLayer {
            retry: self,
            body_limit: 64 * 1024,
            stamp: false,
        }
    }
}

impl<C, H> HttpRetryLayer<C, H> {
    /// See [`RetryLayer::max_attempts`].
    ///
    /// # Panics
    ///
    /// If `attempts` is zero.
    pub fn max_attempts(self, attempts: u32) -> Self {
        self.map(|r| r.max_attempts(attempts))
    }

    /// See [`RetryLayer::backoff`].
    pub fn backoff(self, backoff: Backoff) -> Self {
        self.map(|r| r.backoff(backoff))
    }

    /// See [`RetryLayer::retry_after_cap`].
    pub fn retry_after_cap(self, cap: Duration) -> Self {
        self.map(|r| r.retry_after_cap(cap))
    }

    /// See [`RetryLayer::deadline`].
    ///
    /// # Panics
    ///
    /// If `deadline` is zero.
    pub fn deadline(self, deadline: Duration) -> Self {
        self.map(|r| r.deadline(deadline))
    }

    /// See [`RetryLayer::budget`].
    pub fn budget(self, budget: RetryBudget) -> Self {
        self.map(|r| r.budget(budget))
    }

    /// See [`RetryLayer::no_budget`].
    pub fn no_budget(self) -> Self {
        self.map(RetryLayer::no_budget)
    }

    /// See [`RetryLayer::rng_seed`].
    pub fn rng_seed(self, seed: u64) -> Self {
        self.map(|r| r.rng_seed(seed))
    }

    /// See [`RetryLayer::classify`]: replaces the default [`HttpClassifier`].
    pub fn classify<C2>(self, classifier: C2) -> HttpRetryLayer<C2, H> {
        HttpRetryLayer {
            retry: self.retry.classify(classifier),
            body_limit: self.body_limit,
            stamp: self.stamp,
        }
    }

    /// See [`RetryLayer::on_retry`].
    pub fn on_retry<H2>(self, hook: H2) -> HttpRetryLayer<C, H2> {
        HttpRetryLayer {
            retry: self.retry.on_retry(hook),
            body_limit: self.body_limit,
            stamp: self.stamp,
        }
    }

    fn map(mut self, f: impl FnOnce(RetryLayer<C, H>) -> RetryLayer<C, H>) -> Self {
        self.retry = f(self.retry);
        self
    }

    /// The largest request body buffered for replay; larger ones go out once. Default 64 KiB.
    pub fn body_limit(mut self, limit: usize) -> Self {
        self.body_limit = limit;
        self
    }

    /// Whether an unkeyed `POST` or `PATCH` gets a fresh `Idempotency-Key` (a UUID v4, the same
    /// on every attempt) so it can be retried. Default `false`.
    pub fn stamp_idempotency_keys(mut self, stamp: bool) -> Self {
        self.stamp = stamp;
        self
    }

    /// The counters of this layer and every service it made.
    pub fn stats(&self) -> StatsSnapshot {
        self.retry.stats()
    }
}

impl<C: std::fmt::Debug, H> std::fmt::Debug for HttpRetryLayer<C, H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpRetryLayer")
            .field("retry", &self.retry)
            .field("body_limit", &self.body_limit)
            .field("stamp", &self.stamp)
            .finish()
    }
}

impl<S, C: Clone, H: Clone> Layer<S> for HttpRetryLayer<C, H> {
    type Service = HttpRetry<S, C, H>;

    fn layer(&self, inner: S) -> Self::Service {
        let config = self.retry.config();
        HttpRetry {
            inner,
            config: Arc::new(Config {
                settings: config.settings.clone(),
                classifier: HttpDefault::new(
                    config.classifier.clone(),
                    config.settings.classifier_set,
                ),
                hook: config.hook.clone(),
            }),
            body_limit: self.body_limit,
            stamp: self.stamp,
        }
    }
}

/// Middleware built by [`HttpRetryLayer`].
pub struct HttpRetry<S, C = HttpClassifier, H = ()> {
    inner: S,
    config: Arc<Config<HttpDefault<C>, H>>,
    body_limit: usize,
    stamp: bool,
}

impl<S: Clone, C, H> Clone for HttpRetry<S, C, H> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            config: Arc::clone(&self.config),
            body_limit: self.body_limit,
            stamp: self.stamp,
        }
    }
}

impl<S: std::fmt::Debug, C, H> std::fmt::Debug for HttpRetry<S, C, H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpRetry")
            .field("inner", &self.inner)
            .field("body_limit", &self.body_limit)
            .field("stamp", &self.stamp)
            .finish()
    }
}

/// Whether a request may be sent more than once.
fn is_safe<B>(req: &Request<B>) -> bool {
    matches!(
        *req.method(),
        Method::GET | Method::HEAD | Method::OPTIONS | Method::PUT | Method::DELETE | Method::TRACE
    ) || req.headers().contains_key(IDEMPOTENCY_KEY)
}

impl<S, B, ResB, C, H> Service<Request<B>> for HttpRetry<S, C, H>
where
    S: Service<Request<ReplayBody<B>>, Response = Response<ResB>> + Clone,
    B: Body<Data = Bytes>,
    C: Classify<Response<ResB>, S::Error>,
    H: OnRetry<Response<ResB>, S::Error>,
{
    type Response = Response<ResB>;
    type Error = RetryError<S::Error>;
    type Future = HttpResponseFuture<S, B, HttpDefault<C>, H>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner
            .poll_ready(cx)
            .map_err(|e| RetryError::new(GiveUp::NotRetryable, 0, e))
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        if is_nested() || req.extensions().get::<InAttempt>().is_some() {
            tracing::trace!("nested RetryLayer: deferring to the outer one");
            return HttpResponseFuture::passthrough(
                self.inner.call(req.map(ReplayBody::streaming)),
            );
        }
        let deadline = operation_deadline(&self.config, &req);
        let stampable = matches!(*req.method(), Method::POST | Method::PATCH);
        if self.stamp && stampable && !req.headers().contains_key(IDEMPOTENCY_KEY) {
            let key = uuid::Uuid::new_v4().hyphenated().to_string();
            if let Ok(value) = HeaderValue::from_str(&key) {
                req.headers_mut().insert(IDEMPOTENCY_KEY, value);
            }
        }
        let clone = self.inner.clone();
        let service = std::mem::replace(&mut self.inner, clone);
        if !is_safe(&req) {
            tracing::debug!(method = %req.method(), "unsafe request without an Idempotency-Key: one attempt");
            let stats = &self.config.settings.stats;
            stats.operation();
            stats.attempt();
            return HttpResponseFuture::once(
                call_once(service, req.map(ReplayBody::streaming), deadline),
                deadline,
            );
        }
        let (parts, body) = req.into_parts();
        let template = ReplayRequest {
            method: parts.method,
            uri: parts.uri,
            version: parts.version,
            headers: parts.headers,
            extensions: parts.extensions,
            body: Bytes::new(),
        };
        let config = Arc::clone(&self.config);
        if body.is_end_stream() {
            return HttpResponseFuture::retrying(start(
                Rebuild::new(service),
                template,
                config,
                Some(deadline),
            ));
        }
        HttpResponseFuture {
            state: HttpState::Buffering {
                body: Some(Box::pin(body)),
                collected: Collector::default(),
            },
            pending: Some(Pending {
                service,
                template,
                config,
                limit: self.body_limit,
                deadline,
            }),
        }
    }
}

/// A request in a form that can be sent again: its parts and its whole body.
#[derive(Debug, Clone)]
pub struct ReplayRequest {
    method: Method,
    uri: Uri,
    version: Version,
    headers: HeaderMap,
    extensions: Extensions,
    body: Bytes,
}

impl ReplayRequest {
    fn into_request<B: Body>(self, body: ReplayBody<B>) -> Request<ReplayBody<B>> {
        let mut req = Request::new(body);
        *req.method_mut() = self.method;
        *req.uri_mut() = self.uri;
        *req.version_mut() = self.version;
        *req.headers_mut() = self.headers;
        *req.extensions_mut() = self.extensions;
        req
    }
}

/// Turns each attempt's [`ReplayRequest`] back into an `http::Request`, with the attempt's
/// deadline in its extensions.
pub struct Rebuild<S, B> {
    inner: S,
    _body: PhantomData<fn(B)>,
}

impl<S, B> Rebuild<S, B> {
    fn new(inner: S) -> Self {
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
        // NOTE: runs inside the attempt's scope, so `current` is the operation's deadline.
        if let Some(deadline) = Deadline::current() {
            replay.extensions.insert(deadline);
        }
        replay.extensions.insert(InAttempt);
        let body = ReplayBody::full(std::mem::take(&mut replay.body));
        self.inner.call(replay.into_request(body))
    }
}

struct Pending<S, C, H> {
    service: S,
    template: ReplayRequest,
    config: Arc<Config<C, H>>,
    limit: usize,
    deadline: Deadline,
}

type Core<S, B, C, H> = crate::ResponseFuture<Rebuild<S, B>, ReplayRequest, C, H>;

pin_project! {
    /// Response future of [`HttpRetry`].
    pub struct HttpResponseFuture<S, B, C, H>
    where
        B: Body,
        S: Service<Request<ReplayBody<B>>>,
    {
        #[pin]
        state: HttpState<S::Future, B, Core<S, B, C, H>>,
        pending: Option<Pending<S, C, H>>,
    }
}

pin_project! {
    #[project = HttpStateProj]
    enum HttpState<F, B, R> {
        Buffering { body: Option<Pin<Box<B>>>, collected: Collector },
        Retrying { #[pin] core: R },
        // One attempt, still bound by the operation's deadline.
        Once { #[pin] future: F, #[pin] cutoff: Sleep },
        // Inside another retry layer's attempt: that layer owns the operation.
        Passthrough { #[pin] future: F },
    }
}

impl<S, B, C, H> HttpResponseFuture<S, B, C, H>
where
    B: Body,
    S: Service<Request<ReplayBody<B>>>,
{
    fn once(future: S::Future, deadline: Deadline) -> Self {
        Self {
            state: HttpState::Once {
                future,
                cutoff: tokio::time::sleep_until(deadline.instant()),
            },
            pending: None,
        }
    }

    fn passthrough(future: S::Future) -> Self {
        Self {
            state: HttpState::Passthrough { future },
            pending: None,
        }
    }

    fn retrying(core: Core<S, B, C, H>) -> Self {
        Self {
            state: HttpState::Retrying { core },
            pending: None,
        }
    }
}

impl<S, B, ResB, C, H> Future for HttpResponseFuture<S, B, C, H>
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
                HttpStateProj::Retrying { core } => return core.poll(cx),
                HttpStateProj::Once { future, cutoff } => {
                    if let Poll::Ready(outcome) = future.poll(cx) {
                        return Poll::Ready(
                            outcome.map_err(|e| RetryError::new(GiveUp::NotRetryable, 1, e)),
                        );
                    }
                    ready!(cutoff.poll(cx));
                    return Poll::Ready(Err(RetryError::deadline(1)));
                }
                HttpStateProj::Passthrough { future } => {
                    return Poll::Ready(
                        ready!(future.poll(cx))
                            .map_err(|e| RetryError::new(GiveUp::NotRetryable, 1, e)),
                    );
                }
                HttpStateProj::Buffering { body, collected } => {
                    let (Some(stream), Some(pending)) = (body.as_mut(), this.pending.as_ref())
                    else {
                        panic!("HttpResponseFuture polled after completion");
                    };
                    // Request trailers are not replayed.
                    let mut trailers = None;
                    let outcome = ready!(collected.poll_collect(
                        stream.as_mut(),
                        pending.limit,
                        &mut trailers,
                        cx
                    ));
                    let Some(Pending {
                        service,
                        template,
                        config,
                        deadline,
                        ..
                    }) = this.pending.take()
                    else {
                        panic!("HttpResponseFuture polled after completion");
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
                                core: start(Rebuild::new(service), replay, config, Some(deadline)),
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
                            panic!("HttpResponseFuture polled after completion")
                        }
                    }
                }
            }
        }
    }
}

/// The request body the inner service receives from [`HttpRetry`]: the buffered bytes
/// (replayable, [`full`](BufferedBody::full)), the original body for a request sent once
/// ([`streaming`](BufferedBody::streaming), [`prefixed`](BufferedBody::prefixed) when part of
/// it was read), or the bytes read and then the error of a body that failed while buffering
/// ([`failed`](BufferedBody::failed)).
pub type ReplayBody<B> = BufferedBody<B>;

/// The operation's deadline: this layer's own, or an earlier one the request already carries
/// (in its extensions, from an outer layer across a `Buffer`, or in the call scope).
fn operation_deadline<C, H, B>(config: &Config<C, H>, req: &Request<B>) -> Deadline {
    let own = Deadline::at(saturating_add(
        tokio::time::Instant::now(),
        config.settings.deadline,
    ));
    match Deadline::of(req) {
        Some(outer) if outer < own => outer,
        _ => own,
    }
}

/// Sends a request that gets a single attempt, with the operation's deadline in its extensions
/// and in scope (for an `HttpTimeoutLayer` below), marked as inside an attempt.
fn call_once<S, B>(mut service: S, mut req: Request<B>, deadline: Deadline) -> S::Future
where
    S: Service<Request<B>>,
{
    req.extensions_mut().insert(deadline);
    req.extensions_mut().insert(InAttempt);
    in_attempt(deadline, || service.call(req))
}
