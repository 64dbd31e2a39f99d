//! The states of a covered request, which the future dispatches on and each step returns.

use super::pending::PendingClaim;
use super::read::RequestRead;
use crate::body::{RequestBody, ResponseBody};
use crate::store::Settled;
use crate::store::{IdempotencyStore, StoreFuture};
use bytes::Bytes;
use http::{response, HeaderMap, Request, Response};
use http_body::Body;
use pin_project_lite::pin_project;
use std::pin::Pin;
use tower_once_core::body::Collector;
use tower_service::Service;

pin_project! {
    #[project = StateProj]
    pub(super) enum State<Fut, ReqB, ResB: Body, St: IdempotencyStore, E> {
        ReadRequest { #[pin] read: RequestRead<ReqB> },
        // Boxed: only a store whose claim is in flight (a network store, whose future is boxed
        // already) gets here, and inline it would make this the largest state by far (a memory
        // store's ready answer holds a whole stored response), copied on every transition.
        Claim {
            claim: Box<PendingClaim<St>>,
            request: Option<Request<Bytes>>,
        },
        // Fail-open only: the store failed and the handler runs without a claim.
        Unclaimed { #[pin] future: Fut },
        Run { #[pin] future: Fut },
        // The handler wrote its record in its own transaction: did it commit?
        Check {
            check: StoreFuture<Settled>,
            response: Option<Response<ResB>>,
        },
        // Boxed: if the response is too large to store, this body goes to the client as it is.
        ReadResponse {
            body: Option<Pin<Box<ResB>>>,
            parts: Option<response::Parts>,
            collected: Collector,
            trailers: Option<HeaderMap>,
        },
        Finish { result: Option<Result<Response<ResponseBody<ResB>>, E>> },
        // The handler panicked: its key is released (the release awaited), then the panic goes
        // on to the caller.
        Unwind { payload: Option<Box<dyn std::any::Any + Send>> },
        Done,
    }
}

pub(super) type StateOf<S, ReqB, ResB, St> = State<
    <S as Service<Request<RequestBody<ReqB>>>>::Future,
    ReqB,
    ResB,
    St,
    <S as Service<Request<RequestBody<ReqB>>>>::Error,
>;
