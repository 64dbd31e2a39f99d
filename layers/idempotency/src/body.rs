use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use std::pin::Pin;
use std::task::{Context, Poll};

pin_project! {
    /// The request body the inner service receives from
    /// [`Idempotency`](crate::Idempotency): the original body for requests the layer passes
    /// through, the buffered bytes for requests it covers.
    ///
    /// ```
    /// use http_body::Body as _;
    /// use tower_once_idempotency::RequestBody;
    ///
    /// let body = RequestBody::<http_body_util::Empty<bytes::Bytes>>::buffered("hi".into());
    /// assert_eq!(body.size_hint().exact(), Some(2));
    /// ```
    pub struct RequestBody<B> {
        #[pin]
        inner: RequestInner<B>,
    }
}

pin_project! {
    #[project = RequestProj]
    enum RequestInner<B> {
        Buffered { data: Option<Bytes> },
        Streaming { #[pin] body: B },
    }
}

impl<B> RequestBody<B> {
    /// A body of already-buffered bytes.
    pub fn buffered(data: Bytes) -> Self {
        Self {
            inner: RequestInner::Buffered {
                data: (!data.is_empty()).then_some(data),
            },
        }
    }

    pub(crate) fn streaming(body: B) -> Self {
        Self {
            inner: RequestInner::Streaming { body },
        }
    }
}

impl<B> std::fmt::Debug for RequestBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.inner {
            RequestInner::Buffered { data } => f
                .debug_struct("RequestBody::Buffered")
                .field("len", &data.as_ref().map_or(0, Bytes::len))
                .finish(),
            RequestInner::Streaming { .. } => f.write_str("RequestBody::Streaming"),
        }
    }
}

impl<B> Body for RequestBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match self.project().inner.project() {
            RequestProj::Buffered { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
            RequestProj::Streaming { body } => body.poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            RequestInner::Buffered { data } => data.is_none(),
            RequestInner::Streaming { body } => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            RequestInner::Buffered { data } => exact(data.as_ref()),
            RequestInner::Streaming { body } => body.size_hint(),
        }
    }
}

pin_project! {
    /// The response body of [`Idempotency`](crate::Idempotency): the inner service's body as it
    /// streams, a stored or buffered response, or a buffered prefix followed by the rest of a
    /// response too large to store.
    ///
    /// ```
    /// use http_body::Body as _;
    /// use tower_once_idempotency::ResponseBody;
    ///
    /// let body = ResponseBody::<axum::body::Body>::full("{}".into());
    /// assert_eq!(body.size_hint().exact(), Some(2));
    /// ```
    pub struct ResponseBody<B> {
        #[pin]
        inner: ResponseInner<B>,
    }
}

pin_project! {
    #[project = ResponseProj]
    enum ResponseInner<B> {
        Full { data: Option<Bytes>, trailers: Option<HeaderMap> },
        Prefixed { prefix: Option<Bytes>, rest: Pin<Box<B>> },
        Streaming { #[pin] body: B },
    }
}

impl<B> ResponseBody<B> {
    /// A complete body held in memory.
    pub fn full(data: Bytes) -> Self {
        Self::full_with_trailers(data, None)
    }

    pub(crate) fn full_with_trailers(data: Bytes, trailers: Option<HeaderMap>) -> Self {
        Self {
            inner: ResponseInner::Full {
                data: (!data.is_empty()).then_some(data),
                trailers,
            },
        }
    }

    pub(crate) fn prefixed(prefix: Bytes, rest: Pin<Box<B>>) -> Self {
        Self {
            inner: ResponseInner::Prefixed {
                prefix: (!prefix.is_empty()).then_some(prefix),
                rest,
            },
        }
    }

    pub(crate) fn streaming(body: B) -> Self {
        Self {
            inner: ResponseInner::Streaming { body },
        }
    }
}

impl<B> std::fmt::Debug for ResponseBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match &self.inner {
            ResponseInner::Full { .. } => "ResponseBody::Full",
            ResponseInner::Prefixed { .. } => "ResponseBody::Prefixed",
            ResponseInner::Streaming { .. } => "ResponseBody::Streaming",
        })
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
        match self.project().inner.project() {
            ResponseProj::Full { data, trailers } => Poll::Ready(match data.take() {
                Some(data) => Some(Ok(Frame::data(data))),
                None => trailers.take().map(|t| Ok(Frame::trailers(t))),
            }),
            ResponseProj::Prefixed { prefix, rest } => match prefix.take() {
                Some(data) => Poll::Ready(Some(Ok(Frame::data(data)))),
                None => rest.as_mut().poll_frame(cx),
            },
            ResponseProj::Streaming { body } => body.poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            ResponseInner::Full { data, trailers } => data.is_none() && trailers.is_none(),
            ResponseInner::Prefixed { prefix, rest } => prefix.is_none() && rest.is_end_stream(),
            ResponseInner::Streaming { body } => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            ResponseInner::Full { data, .. } => exact(data.as_ref()),
            ResponseInner::Prefixed { prefix, rest } => {
                let extra = prefix.as_ref().map_or(0, |p| p.len() as u64);
                let hint = rest.size_hint();
                let mut sum = SizeHint::new();
                sum.set_lower(hint.lower().saturating_add(extra));
                if let Some(upper) = hint.upper() {
                    sum.set_upper(upper.saturating_add(extra));
                }
                sum
            }
            ResponseInner::Streaming { body } => body.size_hint(),
        }
    }
}

fn exact(data: Option<&Bytes>) -> SizeHint {
    SizeHint::with_exact(data.map_or(0, |d| d.len() as u64))
}

/// Accumulates body chunks up to a limit without copying a body that arrives in one chunk.
#[derive(Debug, Default)]
pub(crate) struct Collector {
    first: Option<Bytes>,
    rest: Option<bytes::BytesMut>,
    len: usize,
}

impl Collector {
    /// Adds `chunk`, or hands it back (nothing added) if the total would pass `limit`.
    pub(crate) fn push(&mut self, chunk: Bytes, limit: usize) -> Result<(), Bytes> {
        if chunk.len() > limit.saturating_sub(self.len) {
            return Err(chunk);
        }
        self.len += chunk.len();
        match (&mut self.first, &mut self.rest) {
            (None, _) => self.first = Some(chunk),
            (Some(first), None) => {
                let mut buf = bytes::BytesMut::with_capacity(first.len() + chunk.len());
                buf.extend_from_slice(first);
                buf.extend_from_slice(&chunk);
                self.rest = Some(buf);
            }
            (Some(_), Some(buf)) => buf.extend_from_slice(&chunk),
        }
        Ok(())
    }

    /// Everything collected, in order.
    pub(crate) fn finish(self) -> Bytes {
        match (self.first, self.rest) {
            (_, Some(buf)) => buf.freeze(),
            (Some(first), None) => first,
            (None, None) => Bytes::new(),
        }
    }

    /// Everything collected followed by `chunk`, ignoring the limit.
    pub(crate) fn finish_with(mut self, chunk: Bytes) -> Bytes {
        if self.first.is_none() {
            return chunk;
        }
        let _ = self.push(chunk, usize::MAX);
        self.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collector_keeps_order_and_limit() {
        let mut c = Collector::default();
        assert!(c.push(Bytes::from_static(b"ab"), 5).is_ok());
        assert!(c.push(Bytes::from_static(b"cd"), 5).is_ok());
        assert_eq!(
            c.push(Bytes::from_static(b"ef"), 5),
            Err(Bytes::from_static(b"ef"))
        );
        assert!(c.push(Bytes::from_static(b"e"), 5).is_ok());
        assert_eq!(c.finish(), "abcde");

        let mut single = Collector::default();
        let chunk = Bytes::from_static(b"zero-copy");
        assert!(single.push(chunk.clone(), 100).is_ok());
        assert_eq!(
            single.finish().as_ptr(),
            chunk.as_ptr(),
            "one chunk is not copied"
        );

        let mut c = Collector::default();
        assert!(c.push(Bytes::from_static(b"ab"), 2).is_ok());
        assert_eq!(c.finish_with(Bytes::from_static(b"cdef")), "abcdef");
    }
}
