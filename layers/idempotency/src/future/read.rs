//! Reading a covered request's body: up to the limit; once it is known to be over the limit,
//! reading and dropping a bounded amount, for a bounded time, before the `413`.

use crate::config::DRAIN_TIME;
use crate::problem::ProblemKind;
use bytes::Bytes;
use http::request;
use http_body::Body;
use pin_project_lite::pin_project;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use tokio::time::Sleep;
use tower_once_core::body::{Collected, Collector};

pin_project! {
    /// The request while its body is read.
    pub(super) struct RequestRead<B> {
        #[pin]
        body: B,
        parts: Option<request::Parts>,
        collected: Collector,
        // Set once the body is known to be over the limit.
        drain: Option<Drain>,
    }
}

/// A body over the limit, read and dropped so that a client still sending reads the `413`.
struct Drain {
    read: usize,
    // Armed when the client first has nothing to send. Boxed: only a refused request gets
    // here, so the happy path's state stays small.
    until: Option<Pin<Box<Sleep>>>,
}

impl Drain {
    fn new(read: usize) -> Self {
        Self { read, until: None }
    }
}

/// A request refused while its body was read: answer `kind`; `close` the connection when the
/// client may still be sending a body nobody reads.
pub(super) struct Refused {
    pub(super) kind: ProblemKind,
    pub(super) close: bool,
}

impl<B> RequestRead<B> {
    /// `over`: the body is known to be over the limit already (its `Content-Length` says so).
    pub(super) fn new(parts: request::Parts, body: B, over: bool) -> Self {
        Self {
            body,
            parts: Some(parts),
            collected: Collector::default(),
            drain: over.then(|| Drain::new(0)),
        }
    }
}

impl<B> RequestRead<B>
where
    B: Body<Data = Bytes>,
{
    /// Reads the body up to `limit` and gives back the request's parts with it; over it,
    /// drains at most `drain_limit` bytes for at most [`DRAIN_TIME`], then refuses.
    pub(super) fn poll_read(
        self: Pin<&mut Self>,
        limit: usize,
        drain_limit: usize,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(request::Parts, Bytes), Refused>> {
        let mut this = self.project();
        if this.drain.is_none() {
            // Request trailers are not part of the request's identity.
            let mut trailers = None;
            match ready!(this
                .collected
                .poll_collect(this.body.as_mut(), limit, &mut trailers, cx))
            {
                Collected::Complete => {
                    let Some(parts) = this.parts.take() else {
                        tower_once_core::polled_after_completion("ResponseFuture")
                    };
                    return Poll::Ready(Ok((parts, std::mem::take(this.collected).finish())));
                }
                Collected::Over(data) => {
                    *this.collected = Collector::default();
                    *this.drain = Some(Drain::new(data.len()));
                }
                Collected::Failed(_) => {
                    return Poll::Ready(Err(Refused {
                        kind: ProblemKind::RequestBodyError,
                        close: false,
                    }));
                }
            }
        }
        let Some(drain) = this.drain.as_mut() else {
            return Poll::Pending;
        };
        let too_large = |close| {
            Err(Refused {
                kind: ProblemKind::BodyTooLarge,
                close,
            })
        };
        loop {
            match this.body.as_mut().poll_frame(cx) {
                Poll::Ready(None) => return Poll::Ready(too_large(false)),
                Poll::Ready(Some(Err(_))) => return Poll::Ready(too_large(true)),
                Poll::Ready(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        drain.read = drain.read.saturating_add(data.len());
                    }
                    if drain.read > drain_limit {
                        return Poll::Ready(too_large(true));
                    }
                }
                // NOTE: bounded in time too: a client that declared a large body and sends
                // nothing (or drips it) gets its 413 once the drain time is up.
                Poll::Pending => {
                    let until = drain
                        .until
                        .get_or_insert_with(|| Box::pin(tokio::time::sleep(DRAIN_TIME)));
                    ready!(until.as_mut().poll(cx));
                    return Poll::Ready(too_large(true));
                }
            }
        }
    }
}
