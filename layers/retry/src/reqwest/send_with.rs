//! reqwest clients: the HTTP retry and timeout layers over a `reqwest::Client`, with requests
//! built the reqwest way (feature `reqwest`).
//!
//! [`ReqwestService`] makes a `reqwest::Client` a `tower::Service<http::Request<B>>`, so the
//! layers stack on it as on any HTTP client. [`RequestBuilderExt::send_with`] sends a request
//! built with reqwest's own builder through such a stack and gives back a `reqwest::Response`.
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! use std::time::Duration;
//! use tower::ServiceBuilder;
//! use tower_once_retry::reqwest::{RequestBuilderExt, ReqwestService};
//! use tower_once_retry::RetryLayer;
//! use tower_once_timeout::http::HttpTimeoutLayer;
//!
//! let client = reqwest::Client::new();
//! let retrying = ServiceBuilder::new()
//!     .layer(RetryLayer::new().deadline(Duration::from_secs(10)).into_http().stamp_idempotency_keys(true))
//!     .layer(HttpTimeoutLayer::new(Duration::from_secs(2)))
//!     .service(ReqwestService::new(client.clone()));
//!
//! let response = client
//!     .post("http://127.0.0.1:3000/charges")
//!     .header("content-type", "application/json")
//!     .body(r#"{"order_id":"A","amount":500}"#)
//!     .send_with(retrying.clone()) // one Idempotency-Key on every attempt
//!     .await?;
//! println!("{}", response.status());
//! # Ok(())
//! # }
//! ```
//!
//! # Compared with reqwest-middleware and reqwest-retry
//!
//! `reqwest-retry` retries transient failures with backoff through `reqwest-middleware`. Here the
//! stack is plain tower, so the same layers serve hyper, tonic and reqwest clients, and it adds
//! what those crates leave out: one deadline over all attempts and waits (each attempt's timeout
//! is capped by what is left), `Retry-After` honoured, a retry budget shared by all clones,
//! retries only for idempotent methods or keyed requests, and a stamped `Idempotency-Key` that
//! every attempt repeats. A body is replayed from a buffer (1 MiB by default), so streaming
//! bodies are retried too; reqwest-retry can only retry requests whose body it can clone.

use bytes::Bytes;
use http_body::Body;
use pin_project_lite::pin_project;
use std::error::Error as StdError;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use tower_service::Service;

type BoxError = Box<dyn StdError + Send + Sync>;

/// A `reqwest::Client` as a `tower::Service` over `http::Request`s.
#[derive(Debug, Clone, Default)]
pub struct ReqwestService {
    client: reqwest::Client,
}

impl ReqwestService {
    /// Sends requests with `client`.
    pub const fn new(client: reqwest::Client) -> Self {
        Self { client }
    }

    /// The client.
    pub const fn client(&self) -> &reqwest::Client {
        &self.client
    }
}

impl<B> Service<http::Request<B>> for ReqwestService
where
    B: Body<Data = Bytes> + Send + Sync + 'static,
    B::Error: Into<BoxError>,
{
    type Response = http::Response<reqwest::Body>;
    type Error = reqwest::Error;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), reqwest::Error>> {
        Service::<reqwest::Request>::poll_ready(&mut self.client, cx)
    }

    fn call(&mut self, req: http::Request<B>) -> ResponseFuture {
        let kind = match reqwest::Request::try_from(req.map(reqwest::Body::wrap)) {
            Ok(req) => Kind::Sent {
                future: Service::call(&mut self.client, req),
            },
            Err(error) => Kind::Invalid { error: Some(error) },
        };
        ResponseFuture { kind }
    }
}

type Pending = <reqwest::Client as Service<reqwest::Request>>::Future;

pin_project! {
    /// Response future of [`ReqwestService`].
    pub struct ResponseFuture {
        #[pin]
        kind: Kind,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind {
        Sent { #[pin] future: Pending },
        Invalid { error: Option<reqwest::Error> },
    }
}

impl fmt::Debug for ResponseFuture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl Future for ResponseFuture {
    type Output = Result<http::Response<reqwest::Body>, reqwest::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Sent { future } => Poll::Ready(ready!(future.poll(cx)).map(Into::into)),
            KindProj::Invalid { error } => match error.take() {
                Some(error) => Poll::Ready(Err(error)),
                None => panic!("ResponseFuture polled after completion"),
            },
        }
    }
}

/// Sends a request built with reqwest's builder through a tower stack.
pub trait RequestBuilderExt {
    /// Builds the request and sends it through `service` (for example retry and timeout layers
    /// over a [`ReqwestService`]); the answer comes back as a `reqwest::Response`.
    fn send_with<S, ResB>(self, service: S) -> SendWith<S>
    where
        S: Service<http::Request<reqwest::Body>, Response = http::Response<ResB>>,
        ResB: Body<Data = Bytes> + Send + Sync + 'static,
        ResB::Error: Into<BoxError>;
}

impl RequestBuilderExt for reqwest::RequestBuilder {
    fn send_with<S, ResB>(self, service: S) -> SendWith<S>
    where
        S: Service<http::Request<reqwest::Body>, Response = http::Response<ResB>>,
        ResB: Body<Data = Bytes> + Send + Sync + 'static,
        ResB::Error: Into<BoxError>,
    {
        let request = self
            .build()
            .and_then(http::Request::<reqwest::Body>::try_from);
        let state = match request {
            Ok(request) => State::Ready {
                service: Some(service),
                request: Some(request),
            },
            Err(error) => State::Invalid { error: Some(error) },
        };
        SendWith { state }
    }
}

pin_project! {
    /// Future of [`RequestBuilderExt::send_with`].
    pub struct SendWith<S>
    where
        S: Service<http::Request<reqwest::Body>>,
    {
        #[pin]
        state: State<S, S::Future>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, F> {
        Ready { service: Option<S>, request: Option<http::Request<reqwest::Body>> },
        Calling { #[pin] future: F },
        Invalid { error: Option<reqwest::Error> },
    }
}

impl<S> fmt::Debug for SendWith<S>
where
    S: Service<http::Request<reqwest::Body>>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SendWith").finish_non_exhaustive()
    }
}

impl<S, ResB> Future for SendWith<S>
where
    S: Service<http::Request<reqwest::Body>, Response = http::Response<ResB>>,
    ResB: Body<Data = Bytes> + Send + Sync + 'static,
    ResB::Error: Into<BoxError>,
{
    type Output = Result<reqwest::Response, SendError<S::Error>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Ready { service, request } => {
                    let Some(svc) = service.as_mut() else {
                        panic!("SendWith polled after completion")
                    };
                    if let Err(error) = ready!(svc.poll_ready(cx)) {
                        return Poll::Ready(Err(SendError::service(error)));
                    }
                    let (Some(mut svc), Some(request)) = (service.take(), request.take()) else {
                        panic!("SendWith polled after completion")
                    };
                    let future = svc.call(request);
                    this.state.set(State::Calling { future });
                }
                StateProj::Calling { future } => {
                    let response = ready!(future.poll(cx)).map_err(SendError::service)?;
                    let response = response.map(reqwest::Body::wrap);
                    return Poll::Ready(Ok(reqwest::Response::from(response)));
                }
                StateProj::Invalid { error } => match error.take() {
                    Some(error) => return Poll::Ready(Err(SendError::build(error))),
                    None => panic!("SendWith polled after completion"),
                },
            }
        }
    }
}

/// The error of [`RequestBuilderExt::send_with`]: the request could not be built, or the stack
/// failed (for a retry stack, a [`RetryError`](crate::RetryError) that says why it stopped).
#[derive(Debug)]
pub struct SendError<E> {
    kind: SendErrorKind<E>,
}

#[derive(Debug)]
enum SendErrorKind<E> {
    Build(reqwest::Error),
    Service(E),
}

impl<E> SendError<E> {
    fn build(error: reqwest::Error) -> Self {
        Self {
            kind: SendErrorKind::Build(error),
        }
    }

    fn service(error: E) -> Self {
        Self {
            kind: SendErrorKind::Service(error),
        }
    }

    /// Whether reqwest could not build the request (a bad URL, a body that failed to encode).
    pub fn is_build(&self) -> bool {
        matches!(self.kind, SendErrorKind::Build(_))
    }

    /// The stack's error, if that is what failed.
    pub fn get_inner(&self) -> Option<&E> {
        match &self.kind {
            SendErrorKind::Service(e) => Some(e),
            SendErrorKind::Build(_) => None,
        }
    }

    /// The stack's error, or reqwest's build error.
    pub fn into_inner(self) -> Result<E, reqwest::Error> {
        match self.kind {
            SendErrorKind::Service(e) => Ok(e),
            SendErrorKind::Build(e) => Err(e),
        }
    }
}

impl<E: fmt::Display> fmt::Display for SendError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            SendErrorKind::Build(e) => write!(f, "could not build the request: {e}"),
            SendErrorKind::Service(e) => e.fmt(f),
        }
    }
}

impl<E: StdError + 'static> StdError for SendError<E> {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        match &self.kind {
            SendErrorKind::Build(e) => Some(e),
            SendErrorKind::Service(e) => Some(e),
        }
    }
}
