//! The response future: the client's call, then the start of the response body.

use super::error::HttpSendError;
use super::response::Delivered;
use bytes::Bytes;
use http::response::Parts;
use http::Response;
use http_body::Body;
use pin_project_lite::pin_project;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::time::{Instant, Sleep};
use tower_once_core::body::Collector;
use tower_once_retry::classify::{Action, Classify};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How much of a response body is read: a success's, so the connection can carry the next
/// message, and a failure's, so its text reaches the row's `last_error`.
pub(super) const BODY_LIMIT: usize = 64 * 1024;

/// Reading a body stops this long before the send's deadline, so the relay's cutoff never
/// turns a provider's answer into a timed-out attempt.
pub(super) const READ_MARGIN: Duration = Duration::from_millis(100);

pin_project! {
    /// Response future of [`HttpSender`](super::HttpSender).
    pub struct ResponseFuture<F, B, C> {
        #[pin]
        state: State<F, B>,
        classifier: Arc<C>,
        // When reading the body gives up (the send's deadline less the margin); `None`
        // outside a deadline.
        read_until: Option<Instant>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, B> {
        // Decided before any call (no route, a key that is no header).
        Failed { error: Option<HttpSendError> },
        Calling { #[pin] call: F },
        Reading {
            #[pin]
            body: B,
            #[pin]
            cutoff: Option<Sleep>,
            read: Read,
        },
    }
}

/// A classified answer whose body is being read.
struct Read {
    parts: Option<Parts>,
    action: Action,
    collected: Collector,
}

impl<F, B, C> ResponseFuture<F, B, C> {
    pub(super) fn failed(error: HttpSendError, classifier: Arc<C>) -> Self {
        Self {
            state: State::Failed { error: Some(error) },
            classifier,
            read_until: None,
        }
    }

    pub(super) fn calling(call: F, classifier: Arc<C>, read_until: Option<Instant>) -> Self {
        Self {
            state: State::Calling { call },
            classifier,
            read_until,
        }
    }
}

impl<F, B, E, C> Future for ResponseFuture<F, B, C>
where
    F: Future<Output = Result<Response<B>, E>>,
    E: Into<BoxError>,
    B: Body<Data = Bytes>,
    C: Classify<Response<B>, E>,
{
    type Output = Result<Delivered, HttpSendError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            let next = match this.state.as_mut().project() {
                StateProj::Failed { error } => match error.take() {
                    Some(error) => return Poll::Ready(Err(error)),
                    None => panic!("ResponseFuture polled after completion"),
                },
                StateProj::Calling { call } => {
                    let outcome = ready!(call.poll(cx));
                    match classified(outcome, &**this.classifier) {
                        Ok((response, action)) => reading(response, action, *this.read_until),
                        Err(error) => return Poll::Ready(Err(error)),
                    }
                }
                StateProj::Reading { body, cutoff, read } => {
                    return poll_read(body, cutoff, read, cx).map(Read::finish)
                }
            };
            this.state.set(next);
        }
    }
}

/// The classifier's verdict on the client's outcome; an error is final here.
pub(super) fn classified<B, E, C>(
    outcome: Result<Response<B>, E>,
    classifier: &C,
) -> Result<(Response<B>, Action), HttpSendError>
where
    E: Into<BoxError>,
    C: Classify<Response<B>, E>,
{
    let action = classifier.classify(&outcome);
    match outcome {
        Ok(response) => Ok((response, action)),
        Err(error) => Err(HttpSendError::transport(error.into(), action)),
    }
}

/// The state that reads `response`'s body, unless no time is left for it.
fn reading<F, B>(
    response: Response<B>,
    action: Action,
    read_until: Option<Instant>,
) -> State<F, B> {
    let (parts, body) = response.into_parts();
    let read = Read {
        parts: Some(parts),
        action,
        collected: Collector::default(),
    };
    let cutoff = read_until.map(tokio::time::sleep_until);
    State::Reading { body, cutoff, read }
}

/// Reads until the body ends, fails or passes the limit, or the cutoff comes; then the answer
/// is complete with whatever arrived.
fn poll_read<B: Body<Data = Bytes>>(
    body: Pin<&mut B>,
    cutoff: Pin<&mut Option<Sleep>>,
    read: &mut Read,
    cx: &mut Context<'_>,
) -> Poll<Read> {
    // NOTE: how the body ends never changes the verdict: a `201` whose body fails was still
    // accepted, and a `400` is as final with half its text.
    let mut trailers = None;
    if read
        .collected
        .poll_collect(body, BODY_LIMIT, &mut trailers, cx)
        .is_pending()
    {
        if let Some(cutoff) = cutoff.as_pin_mut() {
            ready!(cutoff.poll(cx));
        } else {
            return Poll::Pending;
        }
    }
    Poll::Ready(Read {
        parts: read.parts.take(),
        action: read.action,
        collected: std::mem::take(&mut read.collected),
    })
}

impl Read {
    fn finish(self) -> Result<Delivered, HttpSendError> {
        let Some(parts) = self.parts else {
            panic!("ResponseFuture polled after completion");
        };
        let body = self.collected.finish();
        match self.action {
            // NOTE: a redirect is not a delivery (the clients this sender runs on do not
            // follow them): a wrong URL, parked for a person rather than marked sent.
            Action::Success if parts.status.is_redirection() => {
                Err(HttpSendError::answered(parts.status, body, Action::Stop))
            }
            Action::Success => Ok(Delivered::new(parts, body)),
            action => Err(HttpSendError::answered(parts.status, body, action)),
        }
    }
}
