//! The response future: a pass-through, one of the layer's own answers, or the life of a
//! covered request (read the body, claim, run, read the response, finish).

mod claim;
mod replay;

pub(crate) use self::replay::problem;

use self::claim::{ClaimGuard, PendingClaim, StreamingClaim};
use crate::body::{RequestBody, ResponseBody};
use crate::config::Config;
use crate::fingerprint::{Fingerprint, Fingerprinter};
use crate::outcome::Outcome;
use crate::predicate::StorePredicate;
use crate::problem::ProblemKind;
use crate::store::{
    ClaimOutcome, ClaimToken, Completion, IdempotencyStore, StoreError, StoreKey, StoredResponse,
};
use bytes::Bytes;
use http::header::{self, HeaderValue, CONTENT_LENGTH};
use http::{request, response, HeaderMap, Request, Response};
use http_body::Body;
use pin_project_lite::pin_project;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use tokio::time::Sleep;
use tower_once_core::body::{BufferedBody, Collected, Collector};
use tower_once_core::grpc::is_grpc;
use tower_service::Service;
use tracing::Span;

pin_project! {
    /// Response future of [`Idempotency`](crate::Idempotency).
    pub struct ResponseFuture<S, ReqB, ResB, St, F, P>
    where
        ReqB: Body,
        ResB: Body,
        S: Service<Request<RequestBody<ReqB>>>,
        St: IdempotencyStore,
    {
        #[pin]
        kind: Kind<S::Future, ResB, Detach<CoveredFuture<S, ReqB, ResB, St, F, P>>>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<Fut, ResB: Body, Cov> {
        Passthrough { #[pin] future: Fut },
        Respond { response: Option<Response<ResponseBody<ResB>>> },
        Covered { future: Cov },
    }
}

const POLLED_AFTER_COMPLETION: &str = "ResponseFuture polled after completion";

impl<S, ReqB, ResB, St, F, P> ResponseFuture<S, ReqB, ResB, St, F, P>
where
    ReqB: Body,
    ResB: Body,
    S: Service<Request<RequestBody<ReqB>>>,
    St: IdempotencyStore,
{
    pub(crate) fn passthrough(future: S::Future) -> Self {
        Self {
            kind: Kind::Passthrough { future },
        }
    }

    pub(crate) fn rejected(
        problems: &crate::problem::Problems,
        kind: ProblemKind,
        parts: &request::Parts,
        reason: Option<crate::key::InvalidKey>,
    ) -> Self {
        Outcome::Rejected.count();
        tracing::debug!(
            method = %parts.method,
            path = parts.uri.path(),
            outcome = Outcome::Rejected.as_str(),
            problem = kind.type_uri(),
            reason = reason.map(tracing::field::display),
            "idempotency request rejected"
        );
        Self {
            kind: Kind::Respond {
                response: Some(problem(problems, is_grpc(&parts.headers), kind, None)),
            },
        }
    }
}

impl<S, ReqB, ResB, St, F, P> ResponseFuture<S, ReqB, ResB, St, F, P>
where
    S: Service<Request<RequestBody<ReqB>>, Response = Response<ResB>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqB: Body<Data = Bytes> + Send + 'static,
    ResB: Body<Data = Bytes> + Send + 'static,
    ResB::Error: Send,
    St: IdempotencyStore,
    F: Fingerprinter + Send + Sync + 'static,
    P: StorePredicate + Send + Sync + 'static,
{
    pub(crate) fn covered(
        service: S,
        store: St,
        config: Arc<Config<F, P>>,
        key: StoreKey,
        parts: request::Parts,
        body: ReqB,
    ) -> Self {
        let span = tracing::info_span!(
            "idempotency",
            method = %parts.method,
            path = parts.uri.path(),
            store_key = %key,
            outcome = tracing::field::Empty,
        );
        // `Content-Length` over the limit: read (and drop) what the client is sending anyway,
        // then answer 413, so that the client reads the answer.
        let declared = parts
            .headers
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
            .unwrap_or(0);
        let limit = config.settings.body_limit as u64;
        let over = declared > limit || body.size_hint().lower() > limit;
        let cancel = config.settings.cancel_on_disconnect;
        let grpc = is_grpc(&parts.headers);
        let future = CoveredFuture {
            state: State::ReadRequest {
                body,
                parts: Some(parts),
                collected: Collector::default(),
                drained: over.then_some(0),
            },
            renew: None,
            ctx: Ctx {
                grpc,
                service,
                store,
                config,
                key,
                token: ClaimToken::new(),
                fingerprint: Fingerprint::from_bytes([0; 32]),
                claim: None,
            },
            span,
        };
        Self {
            kind: Kind::Covered {
                future: Detach::new(future, !cancel),
            },
        }
    }
}

impl<S, ReqB, ResB, St, F, P> Future for ResponseFuture<S, ReqB, ResB, St, F, P>
where
    S: Service<Request<RequestBody<ReqB>>, Response = Response<ResB>>,
    ReqB: Body<Data = Bytes>,
    ResB: Body<Data = Bytes>,
    St: IdempotencyStore,
    F: Fingerprinter,
    P: StorePredicate,
{
    type Output = Result<Response<ResponseBody<ResB>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Passthrough { future } => {
                let response = ready!(future.poll(cx))?;
                Poll::Ready(Ok(response.map(ResponseBody::streaming)))
            }
            KindProj::Respond { response } => match response.take() {
                Some(response) => Poll::Ready(Ok(response)),
                None => panic!("{POLLED_AFTER_COMPLETION}"),
            },
            KindProj::Covered { future } => future.poll(cx),
        }
    }
}

/// A covered request's future, boxed so that it can move to a task of its own: if the request
/// is dropped while the handler runs (the client went away), the handler still runs to
/// completion and its response is stored, unless cancellation was chosen.
struct Detach<Fut: MustFinish> {
    future: Option<Pin<Box<Fut>>>,
    finish: Option<fn(Pin<Box<Fut>>)>,
}

/// A future that knows whether dropping it now would lose work already started.
trait MustFinish {
    fn must_finish(&self) -> bool;
}

impl<Fut: MustFinish + Future + Send + 'static> Detach<Fut> {
    fn new(future: Fut, finish_detached: bool) -> Self {
        Self {
            future: Some(Box::pin(future)),
            finish: finish_detached.then_some(finish_on_task::<Fut> as fn(Pin<Box<Fut>>)),
        }
    }
}

fn finish_on_task<Fut: Future + Send + 'static>(future: Pin<Box<Fut>>) {
    tracing::debug!("request dropped while its handler runs; finishing it on a task of its own");
    claim::spawn_or_warn(async move {
        let _ = future.await;
    });
}

impl<Fut: MustFinish + Future> Detach<Fut> {
    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Fut::Output> {
        let Some(future) = self.future.as_mut() else {
            panic!("{POLLED_AFTER_COMPLETION}")
        };
        let output = ready!(future.as_mut().poll(cx));
        self.future = None;
        Poll::Ready(output)
    }
}

impl<Fut: MustFinish> Drop for Detach<Fut> {
    fn drop(&mut self) {
        if let (Some(future), Some(finish)) = (self.future.take(), self.finish) {
            if future.must_finish() {
                finish(future);
            }
        }
    }
}

pin_project! {
    /// The life of one covered request. `poll` only dispatches; each state has one method.
    struct CoveredFuture<S, ReqB, ResB, St, F, P>
    where
        ReqB: Body,
        ResB: Body,
        S: Service<Request<RequestBody<ReqB>>>,
        St: IdempotencyStore,
    {
        #[pin]
        state: State<S::Future, ReqB, ResB, St, S::Error>,
        // Fires every third of the lease while the handler runs, to renew the claim.
        #[pin]
        renew: Option<Sleep>,
        ctx: Ctx<S, St, F, P>,
        span: Span,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<Fut, ReqB, ResB: Body, St: IdempotencyStore, E> {
        // `drained` is set once the body is known to be over the limit: the rest is read and
        // dropped (up to a bound) before the 413.
        ReadRequest {
            #[pin] body: ReqB,
            parts: Option<request::Parts>,
            collected: Collector,
            drained: Option<usize>,
        },
        Claim {
            claim: PendingClaim<St>,
            request: Option<Request<Bytes>>,
        },
        // Fail-open only: the store failed and the handler runs without a claim.
        Unclaimed { #[pin] future: Fut },
        Run { #[pin] future: Fut },
        // Boxed: if the response is too large to store, this body goes to the client as it is.
        ReadResponse {
            body: Option<Pin<Box<ResB>>>,
            parts: Option<response::Parts>,
            collected: Collector,
            trailers: Option<HeaderMap>,
        },
        Finish { result: Option<Result<Response<ResponseBody<ResB>>, E>> },
        Done,
    }
}

/// What the states share: the inner service, the store, the claim.
struct Ctx<S, St: IdempotencyStore, F, P> {
    service: S,
    store: St,
    config: Arc<Config<F, P>>,
    key: StoreKey,
    token: ClaimToken,
    fingerprint: Fingerprint,
    claim: Option<ClaimGuard<St>>,
    // Whether the client speaks gRPC (the layer then answers with gRPC statuses).
    grpc: bool,
}

type StateOf<S, ReqB, ResB, St> = State<
    <S as Service<Request<RequestBody<ReqB>>>>::Future,
    ReqB,
    ResB,
    St,
    <S as Service<Request<RequestBody<ReqB>>>>::Error,
>;

impl<S, ReqB, ResB, St, F, P> MustFinish for CoveredFuture<S, ReqB, ResB, St, F, P>
where
    S: Service<Request<RequestBody<ReqB>>>,
    ReqB: Body,
    ResB: Body,
    St: IdempotencyStore,
{
    fn must_finish(&self) -> bool {
        matches!(self.state, State::Run { .. } | State::ReadResponse { .. })
    }
}

impl<S, ReqB, ResB, St, F, P> Future for CoveredFuture<S, ReqB, ResB, St, F, P>
where
    S: Service<Request<RequestBody<ReqB>>, Response = Response<ResB>>,
    ReqB: Body<Data = Bytes>,
    ResB: Body<Data = Bytes>,
    St: IdempotencyStore,
    F: Fingerprinter,
    P: StorePredicate,
{
    type Output = Result<Response<ResponseBody<ResB>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let span: &Span = this.span;
        let _entered = span.enter();
        let ctx = this.ctx;
        loop {
            let next = match this.state.as_mut().project() {
                StateProj::ReadRequest {
                    body,
                    parts,
                    collected,
                    drained,
                } => ready!(ctx.poll_request(span, body, parts, collected, drained, cx)),
                StateProj::Claim { claim, request } => {
                    let outcome = ready!(claim.poll(cx));
                    ctx.claimed(span, outcome, request, this.renew.as_mut())
                }
                StateProj::Unclaimed { future } => {
                    let response = ready!(future.poll(cx));
                    this.state.set(State::Done);
                    return Poll::Ready(response.map(|r| r.map(ResponseBody::streaming)));
                }
                StateProj::Run { future } => {
                    ctx.poll_renew(this.renew.as_mut(), cx);
                    let result = ready!(future.poll(cx));
                    ctx.ran(span, result)
                }
                StateProj::ReadResponse {
                    body,
                    parts,
                    collected,
                    trailers,
                } => {
                    ctx.poll_renew(this.renew.as_mut(), cx);
                    ready!(ctx.poll_response(span, body, parts, collected, trailers, cx))
                }
                StateProj::Finish { result } => {
                    if let Some(claim) = ctx.claim.as_mut() {
                        ready!(claim.poll_finish(cx));
                    }
                    ctx.claim = None;
                    this.renew.set(None);
                    let result = result.take();
                    this.state.set(State::Done);
                    return Poll::Ready(
                        result.unwrap_or_else(|| panic!("{POLLED_AFTER_COMPLETION}")),
                    );
                }
                StateProj::Done => panic!("{POLLED_AFTER_COMPLETION}"),
            };
            this.state.set(next);
        }
    }
}

impl<S, St, F, P> Ctx<S, St, F, P>
where
    St: IdempotencyStore,
    F: Fingerprinter,
    P: StorePredicate,
{
    /// Reads the request body up to the limit, then sends the claim.
    #[allow(clippy::too_many_arguments)]
    fn poll_request<ReqB, ResB>(
        &mut self,
        span: &Span,
        mut body: Pin<&mut ReqB>,
        parts: &mut Option<request::Parts>,
        collected: &mut Collector,
        drained: &mut Option<usize>,
        cx: &mut Context<'_>,
    ) -> Poll<StateOf<S, ReqB, ResB, St>>
    where
        S: Service<Request<RequestBody<ReqB>>, Response = Response<ResB>>,
        ReqB: Body<Data = Bytes>,
        ResB: Body,
    {
        let settings = &self.config.settings;
        if drained.is_none() {
            // Request trailers are not part of the request's identity.
            let mut trailers = None;
            match ready!(collected.poll_collect(
                body.as_mut(),
                settings.body_limit,
                &mut trailers,
                cx
            )) {
                Collected::Complete => {}
                Collected::Over(data) => {
                    *collected = Collector::default();
                    *drained = Some(data.len());
                }
                Collected::Failed(_) => {
                    return Poll::Ready(self.reject(span, ProblemKind::RequestBodyError, false));
                }
            }
        }
        // Over the limit: read and drop the rest (bounded), so the client reads the 413.
        while let Some(count) = drained {
            let Some(frame) = ready!(body.as_mut().poll_frame(cx)) else {
                break;
            };
            match frame.map(|frame| frame.into_data()) {
                Err(_) => return Poll::Ready(self.reject(span, ProblemKind::BodyTooLarge, true)),
                Ok(Ok(data)) => *count = count.saturating_add(data.len()),
                Ok(Err(_)) => {}
            }
            if *count > settings.drain_limit() {
                return Poll::Ready(self.reject(span, ProblemKind::BodyTooLarge, true));
            }
        }
        if drained.is_some() {
            return Poll::Ready(self.reject(span, ProblemKind::BodyTooLarge, false));
        }
        let Some(parts) = parts.take() else {
            panic!("{POLLED_AFTER_COMPLETION}")
        };
        let body = std::mem::take(collected).finish();
        self.fingerprint = self.config.fingerprinter.fingerprint(&parts, &body);
        let future = self
            .store
            .claim(self.key, self.token, self.fingerprint, settings.lease);
        Poll::Ready(State::Claim {
            claim: PendingClaim::new(self.store.clone(), self.key, self.token, future),
            request: Some(Request::from_parts(parts, body)),
        })
    }

    /// Acts on the store's answer to the claim.
    fn claimed<ReqB, ResB>(
        &mut self,
        span: &Span,
        outcome: Result<ClaimOutcome, StoreError>,
        request: &mut Option<Request<Bytes>>,
        mut renew: Pin<&mut Option<Sleep>>,
    ) -> StateOf<S, ReqB, ResB, St>
    where
        S: Service<Request<RequestBody<ReqB>>, Response = Response<ResB>>,
        ReqB: Body<Data = Bytes>,
        ResB: Body,
    {
        let settings = &self.config.settings;
        let Some(mut request) = request.take() else {
            panic!("{POLLED_AFTER_COMPLETION}")
        };
        match outcome {
            Ok(ClaimOutcome::Claimed) => {
                tracing::debug!(token = %self.token, "claimed idempotency key");
                self.claim = Some(ClaimGuard::new(self.store.clone(), self.key, self.token));
                renew.set(Some(tokio::time::sleep(claim::renew_interval(
                    settings.lease,
                ))));
                request.extensions_mut().insert(self.token);
                State::Run {
                    future: self.service.call(request.map(RequestBody::full)),
                }
            }
            Ok(ClaimOutcome::Existing(record)) => State::Finish {
                result: Some(Ok(replay::existing(
                    span,
                    &settings.problems,
                    self.grpc,
                    settings.in_progress_retry_after,
                    record,
                    &self.fingerprint,
                ))),
            },
            Err(error) => {
                // The claim may have landed even though its answer did not arrive.
                claim::release_in_background(self.store.clone(), self.key, self.token);
                if settings.fail_open {
                    Outcome::Unclaimed.record(span);
                    tracing::warn!(%error, "idempotency store failed; running the request without a claim (fail-open)");
                    return State::Unclaimed {
                        future: self.service.call(request.map(RequestBody::full)),
                    };
                }
                Outcome::Unavailable.record(span);
                tracing::warn!(%error, "idempotency store failed; refusing the request (fail-closed)");
                State::Finish {
                    result: Some(Ok(problem(
                        &settings.problems,
                        self.grpc,
                        ProblemKind::StoreUnavailable,
                        Some(settings.unavailable_retry_after),
                    ))),
                }
            }
        }
    }

    /// Acts on the handler's answer: read a response to store, or release the key.
    fn ran<ReqB, ResB>(
        &mut self,
        span: &Span,
        result: Result<Response<ResB>, S::Error>,
    ) -> StateOf<S, ReqB, ResB, St>
    where
        S: Service<Request<RequestBody<ReqB>>, Response = Response<ResB>>,
        ReqB: Body<Data = Bytes>,
        ResB: Body,
    {
        match result {
            Ok(response) => {
                let (parts, body) = response.into_parts();
                if self.config.predicate.should_store(&parts) {
                    return State::ReadResponse {
                        body: Some(Box::pin(body)),
                        parts: Some(parts),
                        collected: Collector::default(),
                        trailers: None,
                    };
                }
                self.release(span, "response not stored");
                let response = Response::from_parts(parts, ResponseBody::streaming(body));
                State::Finish {
                    result: Some(Ok(response)),
                }
            }
            Err(error) => {
                self.release(span, "inner service error");
                State::Finish {
                    result: Some(Err(error)),
                }
            }
        }
    }

    /// Reads the response body up to the store limit, then stores it or releases the key.
    fn poll_response<ReqB, ResB>(
        &mut self,
        span: &Span,
        body: &mut Option<Pin<Box<ResB>>>,
        parts: &mut Option<response::Parts>,
        collected: &mut Collector,
        trailers: &mut Option<HeaderMap>,
        cx: &mut Context<'_>,
    ) -> Poll<StateOf<S, ReqB, ResB, St>>
    where
        S: Service<Request<RequestBody<ReqB>>, Response = Response<ResB>>,
        ReqB: Body<Data = Bytes>,
        ResB: Body<Data = Bytes>,
    {
        let settings = &self.config.settings;
        let Some(stream) = body.as_mut() else {
            panic!("{POLLED_AFTER_COMPLETION}")
        };
        let overflow = match ready!(collected.poll_collect(
            stream.as_mut(),
            settings.response_limit,
            trailers,
            cx
        )) {
            Collected::Complete => None,
            Collected::Over(data) => Some(data),
            Collected::Failed(_) => {
                let response = problem(
                    &settings.problems,
                    self.grpc,
                    ProblemKind::ResponseBodyError,
                    None,
                );
                self.release(span, "response body failed");
                return Poll::Ready(State::Finish {
                    result: Some(Ok(response)),
                });
            }
        };
        let (Some(parts), Some(rest)) = (parts.take(), body.take()) else {
            panic!("{POLLED_AFTER_COMPLETION}")
        };
        let collected = std::mem::take(collected);
        let trailers = trailers.take();
        let response = match overflow {
            Some(data) => {
                // NOTE: the handler ran, so the key must stay taken even though the response
                // cannot be replayed; the streaming body decides between not-replayable (it
                // ended, or the client left) and released (it failed).
                Outcome::NotReplayable.record(span);
                let prefixed = BufferedBody::prefixed(collected.finish_with(data), rest);
                let body = match self.claim.take() {
                    Some(claim) => ResponseBody::held(
                        prefixed,
                        Box::new(StreamingClaim::new(
                            claim,
                            settings.lease,
                            settings.retention,
                        )),
                    ),
                    None => ResponseBody::from_buffered(prefixed),
                };
                Response::from_parts(parts, body)
            }
            None if trailers
                .as_ref()
                .is_some_and(|t| !self.config.predicate.should_store_trailers(t)) =>
            {
                // NOTE: e.g. a gRPC UNAVAILABLE in the trailers: a failure to retry, not an
                // answer to replay.
                self.release(span, "trailers say the call failed");
                let body = ResponseBody::full_with_trailers(collected.finish(), trailers);
                Response::from_parts(parts, body)
            }
            None => {
                Outcome::Stored.record(span);
                let body = collected.finish();
                let stored = StoredResponse {
                    status: parts.status,
                    headers: replay::storable_headers(&parts.headers, &settings.strip_headers),
                    body: body.clone(),
                    trailers: trailers.clone(),
                };
                if let Some(claim) = self.claim.as_mut() {
                    claim.complete(Completion::Response(stored), settings.retention);
                }
                Response::from_parts(parts, ResponseBody::full_with_trailers(body, trailers))
            }
        };
        Poll::Ready(State::Finish {
            result: Some(Ok(response)),
        })
    }

    fn poll_renew(&mut self, renew: Pin<&mut Option<Sleep>>, cx: &mut Context<'_>) {
        if let (Some(timer), Some(claim)) = (renew.as_pin_mut(), self.claim.as_mut()) {
            claim.poll_renew(timer, self.config.settings.lease, cx);
        }
    }

    fn release(&mut self, span: &Span, why: &str) {
        Outcome::Released.record(span);
        tracing::debug!(reason = why, "releasing idempotency key");
        if let Some(claim) = self.claim.as_mut() {
            claim.release();
        }
    }

    /// The layer's own answer to a request it refuses; `close` when the client may still be
    /// sending a body nobody will read.
    fn reject<Fut, ReqB, ResB: Body, E>(
        &self,
        span: &Span,
        kind: ProblemKind,
        close: bool,
    ) -> State<Fut, ReqB, ResB, St, E> {
        Outcome::Rejected.record(span);
        tracing::debug!(problem = kind.type_uri(), "idempotency request rejected");
        let settings = &self.config.settings;
        let mut response = problem(&settings.problems, self.grpc, kind, None);
        if close {
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        State::Finish {
            result: Some(Ok(response)),
        }
    }
}
