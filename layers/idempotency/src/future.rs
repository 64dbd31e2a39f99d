use crate::body::{RequestBody, ResponseBody};
use crate::fingerprint::{Fingerprint, Fingerprinter};
use crate::layer::{Config, IDEMPOTENT_REPLAYED};
use crate::predicate::StorePredicate;
use crate::problem::ProblemKind;
use crate::store::{
    ClaimOutcome, ClaimToken, Completion, ExistingRecord, IdempotencyStore, RecordState,
    StoreError, StoreKey, StoredResponse,
};
use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{request, response, HeaderMap, HeaderName, Request, Response};
use http_body::Body;
use pin_project_lite::pin_project;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::time::{Instant, Sleep};
use tower_once_core::body::Collector;
use tower_once_core::grpc::is_grpc;
use tower_service::Service;
use tracing::Span;

pin_project! {
    /// Response future of [`Idempotency`](crate::Idempotency).
    pub struct ResponseFuture<S, ReqB, ResB, St, Sc, F, P>
    where
        ReqB: Body,
        ResB: Body,
        S: Service<Request<RequestBody<ReqB>>>,
        St: IdempotencyStore,
    {
        #[pin]
        kind: Kind<S::Future, ResB, CoveredFuture<S, ReqB, ResB, St, Sc, F, P>>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<Fut, ResB: Body, Cov> {
        Passthrough { #[pin] future: Fut },
        Respond { response: Option<Response<ResponseBody<ResB>>> },
        Covered { #[pin] future: Cov },
    }
}

pin_project! {
    /// The life of one covered request: read the body, claim, run, read the response, finish.
    struct CoveredFuture<S, ReqB, ResB, St, Sc, F, P>
    where
        ReqB: Body,
        ResB: Body,
        S: Service<Request<RequestBody<ReqB>>>,
        St: IdempotencyStore,
    {
        #[pin]
        state: State<S::Future, ReqB, ResB, PendingClaim<St>, S::Error>,
        // Fires every third of the lease while the handler runs, to renew the claim.
        #[pin]
        renew: Option<Sleep>,
        service: S,
        store: St,
        config: Arc<Config<Sc, F, P>>,
        key: StoreKey,
        token: ClaimToken,
        fingerprint: Fingerprint,
        claim: Option<ClaimGuard<St>>,
        // Whether the client speaks gRPC (the layer then answers with gRPC statuses).
        grpc: bool,
        span: Span,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<Fut, ReqB, ResB: Body, CF, E> {
        ReadRequest {
            #[pin] body: ReqB,
            parts: Option<request::Parts>,
            collected: Collector,
        },
        Claim {
            future: CF,
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

const POLLED_AFTER_COMPLETION: &str = "ResponseFuture polled after completion";

impl<S, ReqB, ResB, St, Sc, F, P> ResponseFuture<S, ReqB, ResB, St, Sc, F, P>
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
        #[cfg(feature = "metrics")]
        metrics::counter!("tower_once_idempotency_requests_total", "outcome" => "rejected")
            .increment(1);
        tracing::debug!(
            method = %parts.method,
            path = parts.uri.path(),
            outcome = "rejected",
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

    pub(crate) fn covered(
        service: S,
        store: St,
        config: Arc<Config<Sc, F, P>>,
        key: StoreKey,
        parts: request::Parts,
        body: ReqB,
    ) -> Self {
        let grpc = is_grpc(&parts.headers);
        let span = tracing::info_span!(
            "idempotency",
            method = %parts.method,
            path = parts.uri.path(),
            store_key = %key,
            outcome = tracing::field::Empty,
        );
        Self {
            kind: Kind::Covered {
                future: CoveredFuture {
                    state: State::ReadRequest {
                        body,
                        parts: Some(parts),
                        collected: Collector::default(),
                    },
                    renew: None,
                    service,
                    store,
                    config,
                    key,
                    token: ClaimToken::new(),
                    fingerprint: Fingerprint::from_bytes([0; 32]),
                    claim: None,
                    grpc,
                    span,
                },
            },
        }
    }
}

impl<S, ReqB, ResB, St, Sc, F, P> Future for ResponseFuture<S, ReqB, ResB, St, Sc, F, P>
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

impl<S, ReqB, ResB, St, Sc, F, P> Future for CoveredFuture<S, ReqB, ResB, St, Sc, F, P>
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
        let _entered = this.span.enter();
        let settings = &this.config.settings;
        loop {
            let next = match this.state.as_mut().project() {
                StateProj::ReadRequest {
                    mut body,
                    parts,
                    collected,
                } => match ready!(body.as_mut().poll_frame(cx)) {
                    Some(Ok(frame)) => {
                        let Ok(data) = frame.into_data() else {
                            continue; // request trailers are not part of the request's identity
                        };
                        match collected.push(data, settings.body_limit) {
                            Ok(()) => continue,
                            Err(_) => reject(
                                this.span,
                                &settings.problems,
                                *this.grpc,
                                ProblemKind::BodyTooLarge,
                            ),
                        }
                    }
                    Some(Err(_)) => reject(
                        this.span,
                        &settings.problems,
                        *this.grpc,
                        ProblemKind::RequestBodyError,
                    ),
                    None => {
                        let Some(parts) = parts.take() else {
                            panic!("{POLLED_AFTER_COMPLETION}")
                        };
                        let body = std::mem::take(collected).finish();
                        *this.fingerprint = this.config.fingerprinter.fingerprint(&parts, &body);
                        let future = this.store.claim(
                            *this.key,
                            *this.token,
                            *this.fingerprint,
                            settings.lease,
                        );
                        State::Claim {
                            future: PendingClaim {
                                future: Some(future),
                                store: this.store.clone(),
                                key: *this.key,
                                token: *this.token,
                            },
                            request: Some(Request::from_parts(parts, body)),
                        }
                    }
                },
                StateProj::Claim { future, request } => {
                    let outcome = ready!(future.poll(cx));
                    let Some(mut request) = request.take() else {
                        panic!("{POLLED_AFTER_COMPLETION}")
                    };
                    match outcome {
                        Ok(ClaimOutcome::Claimed) => {
                            tracing::debug!(outcome = "claimed", token = %this.token, "claimed idempotency key");
                            *this.claim =
                                Some(ClaimGuard::new(this.store.clone(), *this.key, *this.token));
                            this.renew
                                .set(Some(tokio::time::sleep(renew_interval(settings.lease))));
                            request.extensions_mut().insert(*this.token);
                            let future = this.service.call(request.map(RequestBody::full));
                            State::Run { future }
                        }
                        Ok(ClaimOutcome::Existing(record)) => State::Finish {
                            result: Some(Ok(existing(
                                this.span,
                                &settings.problems,
                                *this.grpc,
                                settings.in_progress_retry_after,
                                record,
                                this.fingerprint,
                            ))),
                        },
                        Err(error) if settings.fail_open => {
                            record_outcome(this.span, "unclaimed");
                            tracing::warn!(%error, "idempotency store failed; running the request without a claim (fail-open)");
                            let future = this.service.call(request.map(RequestBody::full));
                            State::Unclaimed { future }
                        }
                        Err(error) => {
                            record_outcome(this.span, "unavailable");
                            tracing::warn!(%error, "idempotency store failed; refusing the request (fail-closed)");
                            State::Finish {
                                result: Some(Ok(problem(
                                    &settings.problems,
                                    *this.grpc,
                                    ProblemKind::StoreUnavailable,
                                    Some(settings.unavailable_retry_after),
                                ))),
                            }
                        }
                    }
                }
                StateProj::Unclaimed { future } => {
                    let response = ready!(future.poll(cx));
                    this.state.set(State::Done);
                    return Poll::Ready(response.map(|r| r.map(ResponseBody::streaming)));
                }
                StateProj::Run { future } => {
                    poll_renew(this.renew.as_mut(), this.claim.as_mut(), settings.lease, cx);
                    match ready!(future.poll(cx)) {
                        Ok(response) => {
                            let (parts, body) = response.into_parts();
                            if this.config.predicate.should_store(&parts) {
                                State::ReadResponse {
                                    body: Some(Box::pin(body)),
                                    parts: Some(parts),
                                    collected: Collector::default(),
                                    trailers: None,
                                }
                            } else {
                                release(this.span, this.claim, "response not stored");
                                let response =
                                    Response::from_parts(parts, ResponseBody::streaming(body));
                                State::Finish {
                                    result: Some(Ok(response)),
                                }
                            }
                        }
                        Err(error) => {
                            release(this.span, this.claim, "inner service error");
                            State::Finish {
                                result: Some(Err(error)),
                            }
                        }
                    }
                }
                StateProj::ReadResponse {
                    body,
                    parts,
                    collected,
                    trailers,
                } => {
                    poll_renew(this.renew.as_mut(), this.claim.as_mut(), settings.lease, cx);
                    let Some(stream) = body.as_mut() else {
                        panic!("{POLLED_AFTER_COMPLETION}")
                    };
                    let frame = ready!(stream.as_mut().poll_frame(cx));
                    let overflow = match frame {
                        Some(Ok(frame)) => match frame.into_data() {
                            Ok(data) => match collected.push(data, settings.response_limit) {
                                Ok(()) => continue,
                                Err(data) => Some(data),
                            },
                            Err(frame) => {
                                if let Ok(more) = frame.into_trailers() {
                                    trailers.get_or_insert_with(HeaderMap::new).extend(more);
                                }
                                continue;
                            }
                        },
                        Some(Err(_)) => {
                            release(this.span, this.claim, "response body failed");
                            let result = Some(Ok(problem(
                                &settings.problems,
                                *this.grpc,
                                ProblemKind::ResponseBodyError,
                                None,
                            )));
                            this.state.set(State::Finish { result });
                            continue;
                        }
                        None => None,
                    };
                    let (Some(parts), Some(rest)) = (parts.take(), body.take()) else {
                        panic!("{POLLED_AFTER_COMPLETION}")
                    };
                    let collected = std::mem::take(collected);
                    let response = match overflow {
                        Some(data) => {
                            // NOTE: the handler ran, so the key must stay taken even though the
                            // response cannot be replayed (see `Completion::NotReplayable`).
                            record_outcome(this.span, "not_replayable");
                            finish(this.claim, Completion::NotReplayable, settings.retention);
                            let prefix = collected.finish_with(data);
                            Response::from_parts(parts, ResponseBody::prefixed(prefix, rest))
                        }
                        None if trailers
                            .as_ref()
                            .is_some_and(|t| !this.config.predicate.should_store_trailers(t)) =>
                        {
                            // NOTE: e.g. a gRPC UNAVAILABLE in the trailers: a failure to retry,
                            // not an answer to replay.
                            release(this.span, this.claim, "trailers say the call failed");
                            let body = ResponseBody::full_with_trailers(
                                collected.finish(),
                                trailers.take(),
                            );
                            Response::from_parts(parts, body)
                        }
                        None => {
                            record_outcome(this.span, "stored");
                            let body = collected.finish();
                            let stored = StoredResponse {
                                status: parts.status,
                                headers: storable_headers(&parts.headers, &settings.strip_headers),
                                body: body.clone(),
                                trailers: trailers.clone(),
                            };
                            finish(this.claim, Completion::Response(stored), settings.retention);
                            let body = ResponseBody::full_with_trailers(body, trailers.take());
                            Response::from_parts(parts, body)
                        }
                    };
                    State::Finish {
                        result: Some(Ok(response)),
                    }
                }
                StateProj::Finish { result } => {
                    if let Some(claim) = this.claim.as_mut() {
                        ready!(claim.poll_finish(cx));
                    }
                    *this.claim = None;
                    this.renew.set(None);
                    let Some(result) = result.take() else {
                        panic!("{POLLED_AFTER_COMPLETION}")
                    };
                    this.state.set(State::Done);
                    return Poll::Ready(result);
                }
                StateProj::Done => panic!("{POLLED_AFTER_COMPLETION}"),
            };
            this.state.set(next);
        }
    }
}

fn reject<Fut, ReqB, ResB: Body, CF, E>(
    span: &Span,
    problems: &crate::problem::Problems,
    grpc: bool,
    kind: ProblemKind,
) -> State<Fut, ReqB, ResB, CF, E> {
    record_outcome(span, "rejected");
    tracing::debug!(problem = kind.type_uri(), "idempotency request rejected");
    State::Finish {
        result: Some(Ok(problem(problems, grpc, kind, None))),
    }
}

/// Records a covered request's final outcome on its span and, with the `metrics` feature, in
/// `tower_once_idempotency_requests_total{outcome}`.
fn record_outcome(span: &Span, outcome: &'static str) {
    span.record("outcome", outcome);
    #[cfg(feature = "metrics")]
    metrics::counter!("tower_once_idempotency_requests_total", "outcome" => outcome).increment(1);
}

fn problem<B: Body>(
    problems: &crate::problem::Problems,
    grpc: bool,
    kind: ProblemKind,
    retry_after: Option<Duration>,
) -> Response<ResponseBody<B>> {
    problems
        .response(kind, retry_after, grpc)
        .map(ResponseBody::full)
}

/// The answer to a request whose key is held by an existing record.
fn existing<B: Body>(
    span: &Span,
    problems: &crate::problem::Problems,
    grpc: bool,
    in_progress_retry_after: Duration,
    record: ExistingRecord,
    fingerprint: &Fingerprint,
) -> Response<ResponseBody<B>> {
    if record.fingerprint != *fingerprint {
        record_outcome(span, "mismatch");
        return problem(problems, grpc, ProblemKind::FingerprintMismatch, None);
    }
    match record.state {
        RecordState::InProgress { lease_remaining } => {
            record_outcome(span, "conflict");
            let after = lease_remaining.min(in_progress_retry_after);
            problem(problems, grpc, ProblemKind::InProgress, Some(after))
        }
        RecordState::NotReplayable => {
            record_outcome(span, "conflict");
            problem(problems, grpc, ProblemKind::NotReplayable, None)
        }
        RecordState::Completed(stored) => {
            record_outcome(span, "replayed");
            let mut response = Response::new(ResponseBody::full_with_trailers(
                stored.body,
                stored.trailers,
            ));
            *response.status_mut() = stored.status;
            *response.headers_mut() = stored.headers;
            response
                .headers_mut()
                .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
            response
        }
    }
}

fn release<St: IdempotencyStore>(span: &Span, claim: &mut Option<ClaimGuard<St>>, why: &str) {
    record_outcome(span, "released");
    tracing::debug!(reason = why, "releasing idempotency key");
    if let Some(claim) = claim {
        claim.release();
    }
}

fn finish<St: IdempotencyStore>(
    claim: &mut Option<ClaimGuard<St>>,
    completion: Completion,
    retention: Duration,
) {
    if let Some(claim) = claim {
        claim.complete(completion, retention);
    }
}

fn renew_interval(lease: Duration) -> Duration {
    lease / 3
}

/// Renews the claim each time the renewal timer fires, and drives an in-flight renewal.
fn poll_renew<St: IdempotencyStore>(
    mut renew: Pin<&mut Option<Sleep>>,
    claim: Option<&mut ClaimGuard<St>>,
    lease: Duration,
    cx: &mut Context<'_>,
) {
    let (Some(mut timer), Some(claim)) = (renew.as_mut().as_pin_mut(), claim) else {
        return;
    };
    claim.poll_extend(cx);
    while timer.as_mut().poll(cx).is_ready() {
        timer.as_mut().reset(Instant::now() + renew_interval(lease));
        claim.extend(lease);
        claim.poll_extend(cx);
    }
}

/// Hop-by-hop headers (RFC 9110 §7.6.1) describe one connection, never a stored response.
const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
];

/// The headers to store: all but hop-by-hop ones, those the `Connection` header names, `Upgrade`
/// and the configured deny-list.
fn storable_headers(headers: &HeaderMap, strip: &[HeaderName]) -> HeaderMap {
    let named_by_connection = |name: &HeaderName| {
        headers.get_all(header::CONNECTION).iter().any(|v| {
            v.to_str().is_ok_and(|v| {
                v.split(',')
                    .any(|token| token.trim().eq_ignore_ascii_case(name.as_str()))
            })
        })
    };
    let mut kept = HeaderMap::with_capacity(headers.len());
    for (name, value) in headers {
        let drop = HOP_BY_HOP.contains(name)
            || name == header::UPGRADE
            || strip.contains(name)
            || named_by_connection(name);
        if !drop {
            kept.append(name.clone(), value.clone());
        }
    }
    kept
}

/// Owns a claim until it is completed or released; if the request's future is dropped first
/// (the client went away), releases the key, or finishes the store write already under way.
struct ClaimGuard<St: IdempotencyStore> {
    store: St,
    key: StoreKey,
    token: ClaimToken,
    op: Op<St>,
}

enum Op<St: IdempotencyStore> {
    Held,
    Extending(St::ExtendFuture),
    Completing(St::CompleteFuture),
    Releasing(St::ReleaseFuture),
    Done,
}

impl<St: IdempotencyStore> ClaimGuard<St> {
    fn new(store: St, key: StoreKey, token: ClaimToken) -> Self {
        Self {
            store,
            key,
            token,
            op: Op::Held,
        }
    }

    fn extend(&mut self, lease: Duration) {
        if let Op::Held = self.op {
            self.op = Op::Extending(self.store.extend(self.key, self.token, lease));
        }
    }

    fn poll_extend(&mut self, cx: &mut Context<'_>) {
        let Op::Extending(future) = &mut self.op else {
            return;
        };
        let Poll::Ready(result) = Pin::new(future).poll(cx) else {
            return;
        };
        self.op = Op::Held;
        match result {
            Ok(true) => tracing::trace!("renewed idempotency lease"),
            Ok(false) => tracing::warn!(
                "idempotency lease lost: the handler outlived its lease and another request may \
                 have claimed the key; use the ClaimToken extension to fence writes"
            ),
            Err(error) => tracing::warn!(%error, "failed to renew idempotency lease; will retry"),
        }
    }

    fn complete(&mut self, completion: Completion, retention: Duration) {
        self.op = Op::Completing(
            self.store
                .complete(self.key, self.token, completion, retention),
        );
    }

    fn release(&mut self) {
        self.op = Op::Releasing(self.store.release(self.key, self.token));
    }

    fn poll_finish(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let (result, completing) = match &mut self.op {
            Op::Completing(future) => (ready!(Pin::new(future).poll(cx)), true),
            Op::Releasing(future) => (ready!(Pin::new(future).poll(cx)), false),
            Op::Held | Op::Extending(_) | Op::Done => return Poll::Ready(()),
        };
        self.op = Op::Done;
        log_finish(result, completing);
        Poll::Ready(())
    }
}

fn log_finish(result: Result<bool, StoreError>, completing: bool) {
    match (result, completing) {
        (Ok(true), _) => {}
        (Ok(false), true) => {
            tracing::warn!("idempotency claim lost before completion: the response was not stored")
        }
        (Ok(false), false) => tracing::debug!("idempotency claim already gone at release"),
        (Err(error), true) => tracing::error!(
            %error,
            "failed to store idempotent response; duplicates get 409 until the lease expires, \
             then run again"
        ),
        (Err(error), false) => tracing::warn!(
            %error,
            "failed to release idempotency key; it frees itself when its lease expires"
        ),
    }
}

impl<St: IdempotencyStore> Drop for ClaimGuard<St> {
    fn drop(&mut self) {
        match std::mem::replace(&mut self.op, Op::Done) {
            Op::Done => {}
            Op::Held | Op::Extending(_) => {
                tracing::debug!("request dropped while running; releasing idempotency key");
                spawn_detached(self.store.release(self.key, self.token), false);
            }
            Op::Completing(future) => spawn_detached(future, true),
            Op::Releasing(future) => spawn_detached(future, false),
        }
    }
}

fn spawn_detached<Fut>(future: Fut, completing: bool)
where
    Fut: Future<Output = Result<bool, StoreError>> + Send + 'static,
{
    spawn_or_warn(async move { log_finish(future.await, completing) });
}

/// Finishes store work for a request whose future was dropped.
fn spawn_or_warn(work: impl Future<Output = ()> + Send + 'static) {
    match tokio::runtime::Handle::try_current() {
        Ok(handle) => {
            handle.spawn(work);
        }
        Err(_) => tracing::warn!(
            "no tokio runtime to finish an idempotency store operation; the key frees itself \
             when its lease expires"
        ),
    }
}

/// A claim sent to the store whose answer has not arrived yet.
///
/// NOTE: a remote store (Redis) applies the claim when the command arrives, so dropping the
/// request at this point (the client went away) may leave a claim nobody owns, answering 409
/// to every retry for a whole lease. If dropped before the answer, this finishes the claim in
/// the background and releases the key if the claim won.
struct PendingClaim<St: IdempotencyStore> {
    future: Option<St::ClaimFuture>,
    store: St,
    key: StoreKey,
    token: ClaimToken,
}

impl<St: IdempotencyStore> PendingClaim<St> {
    /// The store's answer; afterwards, dropping this does nothing.
    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Result<ClaimOutcome, StoreError>> {
        let Some(future) = self.future.as_mut() else {
            panic!("{POLLED_AFTER_COMPLETION}")
        };
        let outcome = ready!(Pin::new(future).poll(cx));
        self.future = None;
        Poll::Ready(outcome)
    }
}

impl<St: IdempotencyStore> Drop for PendingClaim<St> {
    fn drop(&mut self) {
        let Some(claim) = self.future.take() else {
            return;
        };
        let (store, key, token) = (self.store.clone(), self.key, self.token);
        spawn_or_warn(async move {
            if let Ok(ClaimOutcome::Claimed) = claim.await {
                tracing::debug!("request dropped while claiming; releasing the claim that landed");
                log_finish(store.release(key, token).await, false);
            }
        });
    }
}
