use crate::body::{RequestBody, ResponseBody};
use crate::config::Config;
use crate::fingerprint::{Fingerprinter, Xxh3Fingerprint};
use crate::future::ResponseFuture;
use crate::predicate::{DefaultPredicate, StorePredicate};
use crate::problem::ProblemKind;
use crate::scope::Scope;
use crate::store::{IdempotencyStore, MemoryStore, StoreKey};
use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};
use tower_service::Service;

/// Middleware that runs each keyed request's handler once and replays its response to retries.
///
/// Built by [`IdempotencyLayer`](crate::IdempotencyLayer); see the [crate docs](crate).
pub struct Idempotency<S, St = MemoryStore, Sc = (), F = Xxh3Fingerprint, P = DefaultPredicate> {
    inner: S,
    store: St,
    scope: Sc,
    config: Arc<Config<F, P>>,
}

impl<S, St, Sc, F, P> Idempotency<S, St, Sc, F, P> {
    pub(crate) fn new(inner: S, store: St, scope: Sc, config: Arc<Config<F, P>>) -> Self {
        Self {
            inner,
            store,
            scope,
            config,
        }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, consuming this one.
    pub fn into_inner(self) -> S {
        self.inner
    }

    /// The store this service uses.
    pub fn store_ref(&self) -> &St {
        &self.store
    }
}

impl<S, St: crate::store::IdempotencyStore, Sc, F, P> Idempotency<S, St, Sc, F, P> {
    /// The work this service finishes on tasks of its own, its store's included: see
    /// [`Detached`](crate::Detached).
    pub fn detached(&self) -> crate::detached::Detached {
        self.config.detached.including(self.store.background())
    }
}

impl<S: Clone, St: Clone, Sc: Clone, F, P> Clone for Idempotency<S, St, Sc, F, P> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            store: self.store.clone(),
            scope: self.scope.clone(),
            config: Arc::clone(&self.config),
        }
    }
}

impl<S: fmt::Debug, St: fmt::Debug, Sc, F, P> fmt::Debug for Idempotency<S, St, Sc, F, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Idempotency")
            .field("inner", &self.inner)
            .field("store", &self.store)
            .field("scope", &std::any::type_name::<Sc>())
            .field("config", &self.config)
            .finish()
    }
}

impl<S, St, Sc, F, P, ReqB, ResB> Service<Request<ReqB>> for Idempotency<S, St, Sc, F, P>
where
    S: Service<Request<RequestBody<ReqB>>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqB: Body<Data = Bytes> + Send + 'static,
    ResB: Body<Data = Bytes> + Send + 'static,
    ResB::Error: Send,
    St: IdempotencyStore,
    Sc: Scope,
    F: Fingerprinter + Send + Sync + 'static,
    P: StorePredicate + Send + Sync + 'static,
{
    type Response = Response<ResponseBody<ResB>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, ResB, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        let settings = &self.config.settings;
        if !settings.methods.contains(req.method()) {
            return ResponseFuture::passthrough(self.inner.call(req.map(RequestBody::streaming)));
        }
        let (parts, body) = req.into_parts();
        let mut values = parts.headers.get_all(&settings.header).iter();
        let key = match (values.next(), values.next()) {
            (None, _) if settings.require_key => {
                return ResponseFuture::rejected(
                    &settings.problems,
                    ProblemKind::MissingKey,
                    &parts,
                    None,
                );
            }
            (None, _) => {
                let req = Request::from_parts(parts, RequestBody::streaming(body));
                return ResponseFuture::passthrough(self.inner.call(req));
            }
            (Some(_), Some(_)) => {
                return ResponseFuture::rejected(
                    &settings.problems,
                    ProblemKind::InvalidKey,
                    &parts,
                    None,
                );
            }
            (Some(value), None) => {
                match crate::key::parse(value.as_bytes(), settings.max_key_len) {
                    Ok(key) => key,
                    Err(reason) => {
                        return ResponseFuture::rejected(
                            &settings.problems,
                            ProblemKind::InvalidKey,
                            &parts,
                            Some(reason),
                        );
                    }
                }
            }
        };
        // NOTE: fail closed: a keyed request whose scope cannot say whose it is never reaches
        // a key space shared with other such requests.
        let Some(scope) = self.scope.scope(&parts) else {
            return ResponseFuture::rejected(
                &settings.problems,
                ProblemKind::MissingScope,
                &parts,
                None,
            );
        };
        let store_key = StoreKey::derive(scope.as_ref(), &parts, &key);
        drop(key);

        // The service in `self` was driven to readiness; keep that one for this request.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        ResponseFuture::covered(
            inner,
            self.store.clone(),
            Arc::clone(&self.config),
            store_key,
            parts,
            body,
        )
    }
}
