use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use std::fmt;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use tower_once_core::body::BufferedBody;

/// The request body the inner service receives from [`Idempotency`](crate::Idempotency): the
/// original body for requests the layer passes through
/// ([`streaming`](BufferedBody::streaming)), the buffered bytes for requests it covers
/// ([`full`](BufferedBody::full)).
///
/// ```
/// use http_body::Body as _;
/// use tower_once_idempotency::RequestBody;
///
/// let body = RequestBody::<http_body_util::Empty<bytes::Bytes>>::full("hi".into());
/// assert_eq!(body.size_hint().exact(), Some(2));
/// ```
pub type RequestBody<B> = BufferedBody<B>;

pin_project! {
/// The response body of [`Idempotency`](crate::Idempotency): the inner service's body as it
/// streams, a stored or buffered response (with its trailers), or a buffered prefix followed
/// by the rest of a response too large to store.
///
/// A response too large to store keeps its key claimed while it streams (a task renews the
/// lease, whether or not the client reads); the key becomes *not replayable* when the body
/// ends, or when the client drops it (the handler ran), and is released if the body fails, so
/// that a retry runs again instead of getting `409` for a truncated answer.
///
/// ```
/// use http_body::Body as _;
/// use tower_once_idempotency::ResponseBody;
///
/// let body = ResponseBody::<axum::body::Body>::full("{}".into());
/// assert_eq!(body.size_hint().exact(), Some(2));
/// ```
pub struct ResponseBody<B: Body> {
    #[pin]
    inner: BufferedBody<B>,
    held: Held,
}
}

/// A claim whose fate depends on how a streaming response body ends.
pub(crate) trait HeldClaim: Send + 'static {
    /// The body ended: `kept` when cleanly or by the client leaving, not when it failed.
    fn end(self: Box<Self>, kept: bool);
}

struct Held {
    claim: Option<Box<dyn HeldClaim>>,
    // Set while the body is polled: still set at drop, the poll unwound (the body panicked),
    // which is a failure, not a client leaving.
    polling: bool,
}

impl Held {
    fn new(claim: Option<Box<dyn HeldClaim>>) -> Self {
        Self {
            claim,
            polling: false,
        }
    }

    fn end(&mut self, kept: bool) {
        if let Some(held) = self.claim.take() {
            held.end(kept);
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        // Dropped between polls: the client left, and the handler ran. Dropped during a poll:
        // the body panicked, and the key is released for the retry.
        self.end(!self.polling);
    }
}

impl<B: Body> ResponseBody<B> {
    /// A body of `data`.
    pub fn full(data: Bytes) -> Self {
        Self::from_buffered(BufferedBody::full(data))
    }

    /// A body of `data` followed by `trailers`.
    pub fn full_with_trailers(data: Bytes, trailers: Option<HeaderMap>) -> Self {
        Self::from_buffered(BufferedBody::full_with_trailers(data, trailers))
    }

    /// The inner service's body, as it streams.
    pub fn streaming(body: B) -> Self {
        Self::from_buffered(BufferedBody::streaming(body))
    }

    pub(crate) fn held(body: BufferedBody<B>, held: Box<dyn HeldClaim>) -> Self {
        Self {
            inner: body,
            held: Held::new(Some(held)),
        }
    }

    pub(crate) fn from_buffered(body: BufferedBody<B>) -> Self {
        Self {
            inner: body,
            held: Held::new(None),
        }
    }
}

impl<B: Body> fmt::Debug for ResponseBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseBody")
            .field("inner", &self.inner)
            .field("holds_claim", &self.held.claim.is_some())
            .finish()
    }
}

impl<B> Body for ResponseBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.project();
        this.held.polling = true;
        let frame = this.inner.poll_frame(cx);
        this.held.polling = false;
        let frame = ready!(frame);
        match &frame {
            None => this.held.end(true),
            Some(Err(_)) => this.held.end(false),
            Some(Ok(_)) => {}
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
