//! A `reqwest::Client` as a tower service.

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
