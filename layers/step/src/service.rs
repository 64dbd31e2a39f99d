//! [`Steps`], the service of [`StepLayer`](crate::StepLayer).

use crate::call::{Step, StepRequest};
use crate::codec::{Codec, Json};
use crate::config::Settings;
use crate::error::StepError;
use crate::future::{run, ResponseFuture};
use crate::output::StepOutput;
use crate::verify::Verify;
use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};
use tower_once_core::classify::{Classify, RetryOnError};
use tower_once_core::unsent::Unsent;
use tower_once_idempotency::store::IdempotencyStore;
use tower_service::Service;

/// The service of [`StepLayer`](crate::StepLayer): takes a [`Step`], returns a
/// [`StepOutput`].
pub struct Steps<S, St, C = Json, K = RetryOnError, V = ()> {
    inner: S,
    settings: Arc<Settings<St, C, K, V>>,
}

impl<S, St, C, K, V> Steps<S, St, C, K, V> {
    pub(crate) fn new(inner: S, settings: Arc<Settings<St, C, K, V>>) -> Self {
        Self { inner, settings }
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
}

impl<S: Clone, St, C, K, V> Clone for Steps<S, St, C, K, V> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            settings: Arc::clone(&self.settings),
        }
    }
}

impl<S: fmt::Debug, St: fmt::Debug, C: fmt::Debug, K: fmt::Debug, V: fmt::Debug> fmt::Debug
    for Steps<S, St, C, K, V>
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Steps")
            .field("inner", &self.inner)
            .field("settings", &self.settings)
            .finish()
    }
}

impl<S, St, C, K, V, Req> Service<Step<Req>> for Steps<S, St, C, K, V>
where
    S: Service<Req> + Clone + Send + 'static,
    S::Future: Send,
    S::Response: Send + 'static,
    S::Error: Unsent + Send + 'static,
    Req: StepRequest + Send + 'static,
    St: IdempotencyStore,
    C: Codec<S::Response> + Send + Sync + 'static,
    K: Classify<S::Response, S::Error> + Send + Sync + 'static,
    V: Verify<S::Response> + Send + Sync + 'static,
{
    type Response = StepOutput<S::Response>;
    type Error = StepError<S::Error>;
    type Future = ResponseFuture<S::Response, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(StepError::inner)
    }

    fn call(&mut self, step: Step<Req>) -> Self::Future {
        // The ready service goes into the future; the clone stays for the next poll_ready.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        ResponseFuture::new(run(inner, Arc::clone(&self.settings), step))
    }
}
