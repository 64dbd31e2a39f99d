//! The life of one covered request: read the body, claim, run, read the response, finish.

use super::finish_on_drop::Unfinished;
use super::read::RequestRead;
use super::state::{State, StateProj};
use super::steps::Ctx;
use crate::body::{RequestBody, ResponseBody};
use crate::config::Config;
use crate::fingerprint::{Fingerprint, Fingerprinter};
use crate::predicate::StorePredicate;
use crate::problem::ProblemKind;
use crate::store::{ClaimToken, IdempotencyStore, StoreKey};
use bytes::Bytes;
use http::header::{CONTENT_LENGTH, EXPECT};
use http::{request, Request, Response};
use http_body::Body;
use pin_project_lite::pin_project;
use std::future::Future;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use tokio::time::Sleep;
use tower_once_core::grpc::is_grpc;
use tower_service::Service;
use tracing::Span;

pin_project! {
    /// The life of one covered request. `poll` only dispatches; each state has one method.
    pub(super) struct CoveredFuture<S, ReqB, ResB, St, F, P>
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

impl<S, ReqB, ResB, St, F, P> Unfinished for CoveredFuture<S, ReqB, ResB, St, F, P>
where
    S: Service<Request<RequestBody<ReqB>>>,
    ReqB: Body,
    ResB: Body,
    St: IdempotencyStore,
{
    fn is_unfinished(&self) -> bool {
        matches!(
            self.state,
            State::Run { .. } | State::Check { .. } | State::ReadResponse { .. }
        )
    }

    fn background(&self) -> &crate::detached::Detached {
        &self.ctx.config.detached
    }
}

impl<S, ReqB, ResB, St, F, P> Future for CoveredFuture<S, ReqB, ResB, St, F, P>
where
    S: Service<Request<RequestBody<ReqB>>, Response = Response<ResB>>,
    ReqB: Body<Data = Bytes>,
    ResB: Body<Data = Bytes>,
    St: IdempotencyStore,
    F: Fingerprinter + Send + Sync + 'static,
    P: StorePredicate + Send + Sync + 'static,
{
    type Output = Result<Response<ResponseBody<ResB>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let span: &Span = this.span;
        let _entered = span.enter();
        let ctx = this.ctx;
        loop {
            let next = match this.state.as_mut().project() {
                StateProj::ReadRequest { read } => {
                    ready!(ctx.poll_request(span, read, this.renew.as_mut(), cx))
                }
                StateProj::Claim { claim, request } => {
                    let outcome = ready!(claim.poll(cx));
                    ctx.claimed(span, outcome, request, this.renew.as_mut())
                }
                StateProj::Unclaimed { future } => {
                    let response = ready!(future.poll(cx));
                    this.state.set(State::Done);
                    return Poll::Ready(response.map(|r| r.map(ResponseBody::streaming)));
                }
                // NOTE: the renewal timer is polled only once the handler is pending, so a
                // handler that answers at once never registers a timer.
                StateProj::Run { future } => {
                    // NOTE: a handler that panics has its key released, and the release
                    // awaited, before the panic goes on: the caller's `500` (a
                    // `CatchPanicLayer` outside) is never followed by a retry that meets the
                    // key still held. The panicked future is dropped, never polled again.
                    let polled = catch_unwind(AssertUnwindSafe(|| future.poll(cx)));
                    match polled {
                        Ok(Poll::Ready(result)) => ctx.ran(span, result),
                        Ok(Poll::Pending) => {
                            ctx.poll_renew(this.renew.as_mut(), cx);
                            return Poll::Pending;
                        }
                        Err(payload) => ctx.panicked(span, this.renew.as_mut(), payload),
                    }
                }
                StateProj::Unwind { payload } => {
                    if let Some(claim) = ctx.claim.as_mut() {
                        ready!(claim.poll_finish(cx));
                    }
                    ctx.claim = None;
                    let payload = payload.take();
                    this.state.set(State::Done);
                    match payload {
                        Some(payload) => resume_unwind(payload),
                        None => tower_once_core::polled_after_completion("ResponseFuture"),
                    }
                }
                StateProj::Check { check, response } => {
                    let settled = ready!(check.as_mut().poll(cx));
                    ctx.checked(span, settled, response)
                }
                StateProj::ReadResponse {
                    body,
                    parts,
                    collected,
                    trailers,
                } => match ctx.poll_response(span, body, parts, collected, trailers, cx) {
                    Poll::Ready(next) => next,
                    Poll::Pending => {
                        ctx.poll_renew(this.renew.as_mut(), cx);
                        return Poll::Pending;
                    }
                },
                StateProj::Finish { result } => {
                    if let Some(claim) = ctx.claim.as_mut() {
                        ready!(claim.poll_finish(cx));
                    }
                    ctx.claim = None;
                    this.renew.set(None);
                    let result = result.take();
                    this.state.set(State::Done);
                    return Poll::Ready(result.unwrap_or_else(|| {
                        tower_once_core::polled_after_completion("ResponseFuture")
                    }));
                }
                StateProj::Done => tower_once_core::polled_after_completion("ResponseFuture"),
            };
            this.state.set(next);
        }
    }
}

impl<S, ReqB, ResB, St, F, P> CoveredFuture<S, ReqB, ResB, St, F, P>
where
    S: Service<Request<RequestBody<ReqB>>>,
    ReqB: Body,
    ResB: Body,
    St: IdempotencyStore,
    F: Fingerprinter + Send + Sync + 'static,
    P: StorePredicate + Send + Sync + 'static,
{
    pub(super) fn new(
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
        // NOTE: a client that asked `Expect: 100-continue` has not sent its body yet: reading
        // it would invite the upload (hyper answers `100 Continue` on the first read). Refuse
        // at once instead.
        let refuse_now = over
            && parts
                .headers
                .get(EXPECT)
                .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
        let grpc = is_grpc(&parts.headers);
        let ctx = Ctx {
            grpc,
            service,
            store,
            config,
            key,
            token: ClaimToken::new(),
            fingerprint: Fingerprint::from_bytes([0; 32]),
            claim: None,
        };
        // NOTE: and close the connection: a client that sends the body anyway (curl does after
        // a second) must never have it read as a request of its own.
        let state = if refuse_now {
            ctx.reject(&span, ProblemKind::BodyTooLarge, true)
        } else {
            State::ReadRequest {
                read: RequestRead::new(parts, body, over),
            }
        };
        Self {
            state,
            renew: None,
            ctx,
            span,
        }
    }
}
