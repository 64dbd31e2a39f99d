//! The response future: a pass-through, one of the layer's own answers, or the life of a
//! covered request (read the body, claim, run, read the response, finish).

mod claim;
mod covered;
mod finish_on_drop;
mod pending;
mod read;
mod replay;
mod state;
mod steps;
mod streaming;

pub(crate) use self::replay::problem;

use self::covered::CoveredFuture;
use self::finish_on_drop::FinishOnDrop;
use crate::body::{RequestBody, ResponseBody};
use crate::config::Config;
use crate::fingerprint::Fingerprinter;
use crate::outcome::Outcome;
use crate::predicate::StorePredicate;
use crate::problem::ProblemKind;
use crate::store::{IdempotencyStore, StoreKey};
use bytes::Bytes;
use http::{request, Request, Response};
use http_body::Body;
use pin_project_lite::pin_project;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use tower_once_core::grpc::is_grpc;
use tower_service::Service;

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
        kind: Kind<S::Future, ResB, FinishOnDrop<CoveredFuture<S, ReqB, ResB, St, F, P>>>,
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
        let cancel = config.settings.cancel_on_disconnect;
        let future = CoveredFuture::new(service, store, config, key, parts, body);
        Self {
            kind: Kind::Covered {
                future: FinishOnDrop::new(future, !cancel),
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
                None => tower_once_core::polled_after_completion("ResponseFuture"),
            },
            KindProj::Covered { future } => future.poll(cx),
        }
    }
}
