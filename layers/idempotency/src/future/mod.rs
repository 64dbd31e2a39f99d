//! The response future: a pass-through, one of the layer's own answers, or the life of a
//! covered request (read the body, claim, run, read the response, finish).

mod claim;
mod covered;
mod finish;
mod finish_on_drop;
mod pending;
mod read;
mod replay;
mod state;
mod steps;
mod streaming;

use self::covered::CoveredFuture;
use self::finish_on_drop::{FinishOnDrop, Unfinished};
pub(crate) use self::replay::problem;
use crate::body::{RequestBody, ResponseBody};
use crate::config::Config;
use crate::fingerprint::Fingerprinter;
use crate::metrics::Outcome;
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
    /// Response future of [`Idempotency`](crate::Idempotency): `F` is the inner service's
    /// future, `B` its response body, `E` its error.
    pub struct ResponseFuture<F, B, E>
    where
        B: Body,
    {
        #[pin]
        kind: Kind<F, B, E>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<F, B: Body, E> {
        Passthrough { #[pin] future: F },
        Respond { response: Option<Response<ResponseBody<B>>> },
        // NOTE: boxed anyway (it may move to a task of its own), so its many type parameters
        // (store, fingerprint, predicate, request body, service) hide behind the box.
        Covered { future: FinishOnDrop<dyn Covered<B, E>> },
    }
}

/// A covered request's future, with the types it is made of erased.
pub(crate) trait Covered<B: Body, E>:
    Future<Output = Result<Response<ResponseBody<B>>, E>> + Unfinished + Send
{
}

impl<T, B: Body, E> Covered<B, E> for T where
    T: Future<Output = Result<Response<ResponseBody<B>>, E>> + Unfinished + Send
{
}

impl<F, B: Body, E> ResponseFuture<F, B, E> {
    pub(crate) fn passthrough(future: F) -> Self {
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

    pub(crate) fn covered<S, ReqB, St, Fp, P>(
        service: S,
        store: St,
        config: Arc<Config<Fp, P>>,
        key: StoreKey,
        parts: request::Parts,
        body: ReqB,
    ) -> Self
    where
        S: Service<Request<RequestBody<ReqB>>, Response = Response<B>, Future = F, Error = E>
            + Send
            + 'static,
        F: Send + 'static,
        E: Send + 'static,
        ReqB: Body<Data = Bytes> + Send + 'static,
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Send,
        St: IdempotencyStore,
        Fp: Fingerprinter + Send + Sync + 'static,
        P: StorePredicate + Send + Sync + 'static,
    {
        let cancel = config.settings.cancel_on_disconnect;
        let future: Pin<Box<dyn Covered<B, E>>> =
            Box::pin(CoveredFuture::new(service, store, config, key, parts, body));
        Self {
            kind: Kind::Covered {
                future: FinishOnDrop::new(future, !cancel),
            },
        }
    }
}

impl<F, B, E> Future for ResponseFuture<F, B, E>
where
    F: Future<Output = Result<Response<B>, E>>,
    B: Body<Data = Bytes>,
{
    type Output = Result<Response<ResponseBody<B>>, E>;

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

impl<F, B: Body, E> std::fmt::Debug for ResponseFuture<F, B, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &self.kind {
            Kind::Passthrough { .. } => "passthrough",
            Kind::Respond { .. } => "respond",
            Kind::Covered { .. } => "covered",
        };
        f.debug_struct("ResponseFuture")
            .field("kind", &kind)
            .finish()
    }
}
