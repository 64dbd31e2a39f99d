//! Sending a request built with reqwest's own builder through any tower stack.

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

/// Sends a request built with reqwest's builder through a tower stack.
pub trait RequestBuilderExt {
    /// Builds the request and sends it through `service` (for example retry and timeout layers
    /// over a [`ReqwestService`](super::ReqwestService)); the answer comes back as a
    /// `reqwest::Response`.
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
