//! The sender: a message in, its topic's request out through the client, the answer
//! classified.

use super::error::HttpSendError;
use super::future::{classified, ResponseFuture, READ_MARGIN};
use super::response::Delivered;
use super::route::Route;
use crate::message::OutboxMessage;
use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use http_body_util::Full;
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use tower_once_retry::classify::{Classify, HttpClassifier};
use tower_once_timeout::Deadline;
use tower_service::Service;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Sends outbox messages as HTTP requests through any tower HTTP client: a
/// `tower::Service<OutboxMessage>` for an [`OutboxRelay`](crate::OutboxRelay).
///
/// Each topic has a [`Route`] (method, URI, headers); the message's dedupe key goes out as the
/// `Idempotency-Key` header and its payload as the body. The answer is classified here, with
/// [`HttpClassifier`] unless [`classify`](Self::classify) says otherwise: a success is
/// [`Delivered`], anything else an [`HttpSendError`] that carries the verdict, which the
/// relay's default classifier follows (a `503` is retried, after its `Retry-After`; a `400`
/// is parked). See the [module docs](super) for the table and an example.
pub struct HttpSender<S, C = HttpClassifier> {
    client: S,
    routes: Arc<HashMap<String, Route>>,
    classifier: Arc<C>,
}

impl<S> HttpSender<S> {
    /// A sender over `client` (a `Service<http::Request<Full<Bytes>>>` answering
    /// `http::Response`s), with no routes yet and HTTP's usual classification.
    pub fn new(client: S) -> Self {
        Self {
            client,
            routes: Arc::new(HashMap::new()),
            classifier: Arc::new(HttpClassifier),
        }
    }
}

impl<S, C> HttpSender<S, C> {
    /// Sends messages of `topic` as `route` says; a topic routed twice keeps the last route.
    pub fn route(mut self, topic: impl Into<String>, route: Route) -> Self {
        Arc::make_mut(&mut self.routes).insert(topic.into(), route);
        self
    }

    /// Classifies the client's outcomes with `classifier` instead of [`HttpClassifier`]: its
    /// `Success` is a delivery, its `Stop` parks the row, its `Retry { after }` tries again.
    pub fn classify<C2>(self, classifier: C2) -> HttpSender<S, C2> {
        HttpSender {
            client: self.client,
            routes: self.routes,
            classifier: Arc::new(classifier),
        }
    }

    /// The route of `topic`, if it has one.
    pub fn route_of(&self, topic: &str) -> Option<&Route> {
        self.routes.get(topic)
    }

    /// The client.
    pub fn get_ref(&self) -> &S {
        &self.client
    }

    /// The client, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.client
    }

    /// The client, consuming the sender.
    pub fn into_inner(self) -> S {
        self.client
    }
}

impl<S: Clone, C> Clone for HttpSender<S, C> {
    fn clone(&self) -> Self {
        Self {
            client: self.client.clone(),
            routes: Arc::clone(&self.routes),
            classifier: Arc::clone(&self.classifier),
        }
    }
}

impl<S: fmt::Debug, C> fmt::Debug for HttpSender<S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpSender")
            .field("client", &self.client)
            // Topics only: route headers may hold credentials.
            .field("topics", &self.routes.keys().collect::<Vec<_>>())
            .field("classifier", &std::any::type_name::<C>())
            .finish()
    }
}

impl<S, B, C> Service<OutboxMessage> for HttpSender<S, C>
where
    S: Service<Request<Full<Bytes>>, Response = Response<B>>,
    S::Error: Into<BoxError>,
    B: Body<Data = Bytes>,
    C: Classify<Response<B>, S::Error>,
{
    type Response = Delivered;
    type Error = HttpSendError;
    type Future = ResponseFuture<S::Future, B, C>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        match ready!(self.client.poll_ready(cx)) {
            Ok(()) => Poll::Ready(Ok(())),
            // `classified` turns every client error into an `HttpSendError`.
            Err(e) => Poll::Ready(classified(Err(e), &*self.classifier).map(|_| ())),
        }
    }

    fn call(&mut self, message: OutboxMessage) -> Self::Future {
        let classifier = Arc::clone(&self.classifier);
        let Some(route) = self.routes.get(message.topic()) else {
            return ResponseFuture::failed(HttpSendError::unrouted(message.topic()), classifier);
        };
        match route.request(&message) {
            Ok(request) => {
                // Inside a relay the send has a deadline; the answer's body is read until
                // shortly before it, never past it.
                let read_until = Deadline::current()
                    .map(|deadline| deadline.instant())
                    .map(|end| end.checked_sub(READ_MARGIN).unwrap_or(end));
                ResponseFuture::calling(self.client.call(request), classifier, read_until)
            }
            Err(error) => ResponseFuture::failed(error, classifier),
        }
    }
}
