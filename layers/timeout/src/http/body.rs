use crate::error::{Elapsed, TimeoutError};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::time::{Instant, Sleep};

pin_project! {
    /// A response body that can be cut off at the call's time limit, so that a server sending
    /// headers and then one byte every few seconds cannot outlast it.
    ///
    /// Without a cover (the default) it is the inner body unchanged.
    pub struct TimeoutBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Body { #[pin] body: B, #[pin] sleep: Option<Sleep>, elapsed: Elapsed },
        Empty,
    }
}

impl<B> TimeoutBody<B> {
    /// The inner body, cut at `until` when given.
    pub(crate) fn new(body: B, cover: Option<(Instant, Elapsed)>) -> Self {
        let (sleep, elapsed) = match cover {
            Some((until, elapsed)) => (Some(tokio::time::sleep_until(until)), elapsed),
            None => (None, Elapsed::new(Default::default(), false)),
        };
        Self {
            kind: Kind::Body {
                body,
                sleep,
                elapsed,
            },
        }
    }

    /// An empty body (for the timeout responses of the server layer).
    pub(crate) fn empty() -> Self {
        Self { kind: Kind::Empty }
    }
}

impl<B> std::fmt::Debug for TimeoutBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match &self.kind {
            Kind::Body { sleep: Some(_), .. } => "TimeoutBody::Covered",
            Kind::Body { sleep: None, .. } => "TimeoutBody::Uncovered",
            Kind::Empty => "TimeoutBody::Empty",
        })
    }
}

impl<B: Body> Body for TimeoutBody<B> {
    type Data = B::Data;
    type Error = TimeoutError<B::Error>;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, Self::Error>>> {
        match self.project().kind.project() {
            KindProj::Body {
                body,
                sleep,
                elapsed,
            } => {
                // NOTE: a frame that is ready wins over a timer that fired in the same poll.
                if let Poll::Ready(frame) = body.poll_frame(cx) {
                    return Poll::Ready(frame.map(|f| f.map_err(TimeoutError::inner)));
                }
                match sleep.as_pin_mut().map(|s| s.poll(cx)) {
                    Some(Poll::Ready(())) => {
                        elapsed.record("http_body");
                        tracing::debug!(limit = ?elapsed.limit(), "response body timed out");
                        Poll::Ready(Some(Err((*elapsed).into())))
                    }
                    _ => Poll::Pending,
                }
            }
            KindProj::Empty => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Body { body, .. } => body.is_end_stream(),
            Kind::Empty => true,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Body { body, .. } => body.size_hint(),
            Kind::Empty => SizeHint::with_exact(0),
        }
    }
}
