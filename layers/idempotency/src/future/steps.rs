//! One method per state of a covered request: what the states share, and what each does.

use super::claim::ClaimGuard;
use super::pending::{self, PendingClaim};
use super::read::{Refused, RequestRead};
use super::replay::{self, problem};
use super::state::{State, StateOf};
use super::streaming::StreamingClaim;
use crate::body::{RequestBody, ResponseBody};
use crate::claim::Claim;
use crate::config::{Config, StoreRules};
use crate::fingerprint::{Fingerprint, Fingerprinter};
use crate::metrics::Outcome;
use crate::predicate::StorePredicate;
use crate::problem::ProblemKind;
use crate::store::{
    ClaimOutcome, ClaimToken, Completion, IdempotencyStore, Lease, StoreError, StoreKey,
    StoredResponse,
};
use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{response, HeaderMap, Request, Response};
use http_body::Body;
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use tokio::time::Sleep;
use tower_once_core::body::{BufferedBody, Collected, Collector};
use tower_service::Service;
use tracing::Span;

/// What the states share: the inner service, the store, the claim.
pub(super) struct Ctx<S, St: IdempotencyStore, F, P> {
    pub(super) service: S,
    pub(super) store: St,
    pub(super) config: Arc<Config<F, P>>,
    pub(super) key: StoreKey,
    pub(super) token: ClaimToken,
    pub(super) fingerprint: Fingerprint,
    pub(super) claim: Option<ClaimGuard<St>>,
    // Whether the client speaks gRPC (the layer then answers with gRPC statuses).
    pub(super) grpc: bool,
}

impl<S, St, F, P> Ctx<S, St, F, P>
where
    St: IdempotencyStore,
    F: Fingerprinter + Send + Sync + 'static,
    P: StorePredicate + Send + Sync + 'static,
{
    /// Reads the request body up to the limit, then sends the claim.
    pub(super) fn poll_request<ReqB, ResB>(
        &mut self,
        span: &Span,
        read: Pin<&mut RequestRead<ReqB>>,
        renew: Pin<&mut Option<Sleep>>,
        cx: &mut Context<'_>,
    ) -> Poll<StateOf<S, ReqB, ResB, St>>
    where
        S: Service<Request<RequestBody<ReqB>>, Response = Response<ResB>>,
        ReqB: Body<Data = Bytes>,
        ResB: Body,
    {
        let settings = &self.config.settings;
        let (parts, body) =
            match ready!(read.poll_read(settings.body_limit, settings.drain_limit(), cx)) {
                Ok(read) => read,
                Err(Refused { kind, close }) => return Poll::Ready(self.reject(span, kind, close)),
            };
        self.fingerprint = self.config.fingerprinter.fingerprint(&parts, &body);
        let mut future = self
            .store
            .claim(self.key, self.token, self.fingerprint, settings.lease);
        let mut request = Some(Request::from_parts(parts, body));
        // A store that answers at once (the memory store) goes straight on: no `Claim` state
        // (the largest, ~600 bytes) to build and move, no guard for a claim in flight.
        if let Poll::Ready(outcome) = Pin::new(&mut future).poll(cx) {
            return Poll::Ready(self.claimed(span, outcome, &mut request, renew));
        }
        Poll::Ready(State::Claim {
            claim: Box::new(PendingClaim::new(
                self.store.clone(),
                self.key,
                self.token,
                future,
                self.config.detached.clone(),
            )),
            request,
        })
    }

    /// Acts on the store's answer to the claim.
    pub(super) fn claimed<ReqB, ResB>(
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
            tower_once_core::polled_after_completion("ResponseFuture")
        };
        match outcome {
            Ok(ClaimOutcome::Claimed) => {
                tracing::debug!(token = %self.token, "claimed idempotency key");
                let lease = Lease::new(self.store.clone(), self.key, self.token, settings.lease);
                renew.set(Some(tokio::time::sleep(lease.interval())));
                self.claim = Some(ClaimGuard::new(lease, self.config.detached.clone()));
                request.extensions_mut().insert(self.token);
                request.extensions_mut().insert(self.key);
                if St::COMPLETES_IN_TRANSACTION {
                    request.extensions_mut().insert(Claim::for_request(
                        self.store.clone(),
                        self.key,
                        self.token,
                        settings.retention,
                        Arc::clone(&self.config) as Arc<dyn StoreRules>,
                    ));
                }
                // NOTE: a handler that panics in `call` (before its future exists) is treated
                // as one that panics when polled: its key released, the release awaited, then
                // the panic goes on.
                let request = request.map(RequestBody::full);
                let service = &mut self.service;
                match catch_unwind(AssertUnwindSafe(|| service.call(request))) {
                    Ok(future) => State::Run { future },
                    Err(payload) => self.panicked(span, renew, payload),
                }
            }
            Ok(ClaimOutcome::Existing(record)) => {
                // NOTE: a record stored under another fingerprint kind (an earlier default)
                // may still be this request's: asked only before a `422`.
                let same = record.fingerprint == self.fingerprint || {
                    let (parts, body) = request.into_parts();
                    self.config
                        .fingerprinter
                        .recognizes(&parts, &body, &record.fingerprint)
                };
                State::Finish {
                    result: Some(Ok(replay::existing(
                        span,
                        &settings.problems,
                        self.grpc,
                        settings.in_progress_retry_after,
                        record,
                        same,
                    ))),
                }
            }
            Err(error) => {
                // The claim may have landed even though its answer did not arrive.
                pending::release_in_background(
                    self.store.clone(),
                    self.key,
                    self.token,
                    &self.config.detached,
                );
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

    /// Reads the response body up to the store limit, then stores it or releases the key.
    pub(super) fn poll_response<ReqB, ResB>(
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
            tower_once_core::polled_after_completion("ResponseFuture")
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
            tower_once_core::polled_after_completion("ResponseFuture")
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
                            settings.retention,
                            &self.config.detached,
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
                    headers: crate::headers::storable_headers(
                        &parts.headers,
                        &settings.strip_headers,
                    ),
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

    pub(super) fn poll_renew(&mut self, renew: Pin<&mut Option<Sleep>>, cx: &mut Context<'_>) {
        if let (Some(timer), Some(claim)) = (renew.as_pin_mut(), self.claim.as_mut()) {
            claim.poll_renew(timer, cx);
        }
    }

    /// The handler panicked: its key is released, and the panic goes on once the release is
    /// done ([`State::Unwind`]).
    pub(super) fn panicked<ReqB, ResB>(
        &mut self,
        span: &Span,
        mut renew: Pin<&mut Option<Sleep>>,
        payload: Box<dyn std::any::Any + Send>,
    ) -> StateOf<S, ReqB, ResB, St>
    where
        S: Service<Request<RequestBody<ReqB>>, Response = Response<ResB>>,
        ReqB: Body<Data = Bytes>,
        ResB: Body,
    {
        tracing::warn!("idempotency handler panicked; releasing its key");
        self.release(span, "the handler panicked");
        renew.set(None);
        State::Unwind {
            payload: Some(payload),
        }
    }

    pub(super) fn release(&mut self, span: &Span, why: &str) {
        Outcome::Released.record(span);
        tracing::debug!(reason = why, "releasing idempotency key");
        if let Some(claim) = self.claim.as_mut() {
            claim.release();
        }
    }

    /// The layer's own answer to a request it refuses; `close` when the client may still be
    /// sending a body nobody will read.
    pub(super) fn reject<Fut, ReqB, ResB: Body, E>(
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
