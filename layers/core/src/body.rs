//! Bodies held (wholly or partly) in memory.

use bytes::{Bytes, BytesMut};
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use std::pin::Pin;
use std::task::{Context, Poll};

pin_project! {
    /// A body that is one of:
    ///
    /// - **full**: bytes held in memory, then optional trailers;
    /// - **prefixed**: bytes already read from a body, then the rest of that body;
    /// - **failed**: bytes already read from a body, then the error that body ended with;
    /// - **streaming**: a body passed through untouched.
    ///
    /// ```
    /// use http_body::Body as _;
    /// use tower_once_core::body::BufferedBody;
    ///
    /// let body = BufferedBody::<http_body_util::Empty<bytes::Bytes>>::full("hi".into());
    /// assert_eq!(body.size_hint().exact(), Some(2));
    /// ```
    pub struct BufferedBody<B: Body> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B: Body> {
        Full { data: Option<Bytes>, trailers: Option<HeaderMap> },
        Prefixed { prefix: Option<Bytes>, rest: Pin<Box<B>> },
        Failed { prefix: Option<Bytes>, error: Option<B::Error> },
        Streaming { #[pin] body: B },
    }
}

fn non_empty(data: Bytes) -> Option<Bytes> {
    (!data.is_empty()).then_some(data)
}

impl<B: Body> BufferedBody<B> {
    /// `data`, held in memory.
    pub fn full(data: Bytes) -> Self {
        Self::full_with_trailers(data, None)
    }

    /// `data` then `trailers`, held in memory.
    pub fn full_with_trailers(data: Bytes, trailers: Option<HeaderMap>) -> Self {
        Self {
            kind: Kind::Full {
                data: non_empty(data),
                trailers,
            },
        }
    }

    /// `prefix` (already read from `rest`), then what is left of `rest`.
    pub fn prefixed(prefix: Bytes, rest: Pin<Box<B>>) -> Self {
        Self {
            kind: Kind::Prefixed {
                prefix: non_empty(prefix),
                rest,
            },
        }
    }

    /// `prefix`, then `error`: a body that failed after `prefix` was read from it.
    pub fn failed(prefix: Bytes, error: B::Error) -> Self {
        Self {
            kind: Kind::Failed {
                prefix: non_empty(prefix),
                error: Some(error),
            },
        }
    }

    /// `body`, untouched.
    pub fn streaming(body: B) -> Self {
        Self {
            kind: Kind::Streaming { body },
        }
    }
}

impl<B: Body> std::fmt::Debug for BufferedBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match &self.kind {
            Kind::Full { .. } => "BufferedBody::Full",
            Kind::Prefixed { .. } => "BufferedBody::Prefixed",
            Kind::Failed { .. } => "BufferedBody::Failed",
            Kind::Streaming { .. } => "BufferedBody::Streaming",
        })
    }
}

impl<B> Body for BufferedBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match self.project().kind.project() {
            KindProj::Full { data, trailers } => Poll::Ready(match data.take() {
                Some(data) => Some(Ok(Frame::data(data))),
                None => trailers.take().map(|t| Ok(Frame::trailers(t))),
            }),
            KindProj::Prefixed { prefix, rest } => match prefix.take() {
                Some(data) => Poll::Ready(Some(Ok(Frame::data(data)))),
                None => rest.as_mut().poll_frame(cx),
            },
            KindProj::Failed { prefix, error } => Poll::Ready(match prefix.take() {
                Some(data) => Some(Ok(Frame::data(data))),
                None => error.take().map(Err),
            }),
            KindProj::Streaming { body } => body.poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Full { data, trailers } => data.is_none() && trailers.is_none(),
            Kind::Prefixed { prefix, rest } => prefix.is_none() && rest.is_end_stream(),
            Kind::Failed { prefix, error } => prefix.is_none() && error.is_none(),
            Kind::Streaming { body } => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        let held = |data: &Option<Bytes>| data.as_ref().map_or(0, |d| d.len() as u64);
        match &self.kind {
            // NOTE: with trailers to send, no exact size: HTTP/1.1 sends trailers only with
            // chunked framing, which a known length would replace.
            Kind::Full {
                data,
                trailers: Some(_),
            } => {
                let mut hint = SizeHint::new();
                hint.set_lower(held(data));
                hint
            }
            Kind::Full { data, .. } => SizeHint::with_exact(held(data)),
            Kind::Failed { prefix, .. } => SizeHint::with_exact(held(prefix)),
            Kind::Prefixed { prefix, rest } => {
                let hint = rest.size_hint();
                let mut sum = SizeHint::new();
                sum.set_lower(hint.lower().saturating_add(held(prefix)));
                if let Some(upper) = hint.upper() {
                    sum.set_upper(upper.saturating_add(held(prefix)));
                }
                sum
            }
            Kind::Streaming { body } => body.size_hint(),
        }
    }
}

/// How [`Collector::poll_collect`] ended.
#[derive(Debug)]
pub enum Collected<E> {
    /// The body ended: everything is in the collector, trailers included.
    Complete,
    /// The next chunk would pass the limit: here it is, not added. The rest of the body is
    /// still unread.
    Over(Bytes),
    /// The body failed; what came before is in the collector.
    Failed(E),
}

/// Accumulates body chunks up to a limit, without copying a body that arrives in one chunk.
///
/// ```
/// use bytes::Bytes;
/// use tower_once_core::body::Collector;
///
/// let mut c = Collector::default();
/// assert!(c.push(Bytes::from_static(b"ab"), 3).is_ok());
/// assert_eq!(c.push(Bytes::from_static(b"cd"), 3), Err(Bytes::from_static(b"cd")));
/// assert_eq!(c.finish_with(Bytes::from_static(b"cd")), "abcd");
/// ```
#[derive(Debug, Default)]
pub struct Collector {
    first: Option<Bytes>,
    rest: Option<BytesMut>,
    len: usize,
}

impl Collector {
    /// Bytes collected so far.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing was collected.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Adds `chunk`, or hands it back (nothing added) if the total would pass `limit`.
    pub fn push(&mut self, chunk: Bytes, limit: usize) -> Result<(), Bytes> {
        if chunk.len() > limit.saturating_sub(self.len) {
            return Err(chunk);
        }
        self.len += chunk.len();
        match (&mut self.first, &mut self.rest) {
            (None, _) => self.first = Some(chunk),
            (Some(first), None) => {
                let mut buf = BytesMut::with_capacity(first.len() + chunk.len());
                buf.extend_from_slice(first);
                buf.extend_from_slice(&chunk);
                self.rest = Some(buf);
            }
            (Some(_), Some(buf)) => buf.extend_from_slice(&chunk),
        }
        Ok(())
    }

    /// Everything collected, in order.
    pub fn finish(self) -> Bytes {
        match (self.first, self.rest) {
            (_, Some(buf)) => buf.freeze(),
            (Some(first), None) => first,
            (None, None) => Bytes::new(),
        }
    }

    /// Reads `body` into this collector until it ends, fails, or its next chunk would pass
    /// `limit`. Trailers are merged into `trailers`. The one loop every layer that buffers a
    /// body uses; each decides what the three endings mean for it.
    pub fn poll_collect<B>(
        &mut self,
        mut body: Pin<&mut B>,
        limit: usize,
        trailers: &mut Option<HeaderMap>,
        cx: &mut Context<'_>,
    ) -> Poll<Collected<B::Error>>
    where
        B: Body<Data = Bytes>,
    {
        loop {
            let Some(frame) = std::task::ready!(body.as_mut().poll_frame(cx)) else {
                return Poll::Ready(Collected::Complete);
            };
            match frame.map(Frame::into_data) {
                Err(error) => return Poll::Ready(Collected::Failed(error)),
                Ok(Ok(data)) => {
                    if let Err(data) = self.push(data, limit) {
                        return Poll::Ready(Collected::Over(data));
                    }
                }
                Ok(Err(frame)) => {
                    if let Ok(more) = frame.into_trailers() {
                        trailers.get_or_insert_with(HeaderMap::new).extend(more);
                    }
                }
            }
        }
    }

    /// Everything collected followed by `chunk`, ignoring the limit.
    pub fn finish_with(mut self, chunk: Bytes) -> Bytes {
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
    use http_body_util::BodyExt;

    #[test]
    fn collector_keeps_order_limit_and_avoids_copies() {
        let mut c = Collector::default();
        assert!(c.push(Bytes::from_static(b"ab"), 5).is_ok());
        assert!(c.push(Bytes::from_static(b"cd"), 5).is_ok());
        assert_eq!(
            c.push(Bytes::from_static(b"ef"), 5),
            Err(Bytes::from_static(b"ef"))
        );
        assert!(c.push(Bytes::from_static(b"e"), 5).is_ok());
        assert_eq!(c.len(), 5);
        assert_eq!(c.finish(), "abcde");

        let mut single = Collector::default();
        let chunk = Bytes::from_static(b"zero-copy");
        assert!(single.push(chunk.clone(), 100).is_ok());
        assert_eq!(
            single.finish().as_ptr(),
            chunk.as_ptr(),
            "one chunk is not copied"
        );
    }

    type Chunks = http_body_util::StreamBody<
        futures_util::stream::Iter<std::vec::IntoIter<Result<Frame<Bytes>, &'static str>>>,
    >;

    fn chunks(frames: Vec<Result<Frame<Bytes>, &'static str>>) -> Chunks {
        http_body_util::StreamBody::new(futures_util::stream::iter(frames))
    }

    fn collect(body: BufferedBody<Chunks>) -> Result<(Bytes, Option<HeaderMap>), &'static str> {
        use futures_util::FutureExt;
        let collected = body
            .collect()
            .now_or_never()
            .expect("every frame is ready")?;
        let trailers = collected.trailers().cloned();
        Ok((collected.to_bytes(), trailers))
    }

    #[test]
    fn every_variant_yields_what_it_holds() {
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
        let full = BufferedBody::full_with_trailers(Bytes::from_static(b"msg"), Some(trailers));
        assert_eq!(
            full.size_hint().exact(),
            None,
            "trailers need chunked framing on HTTP/1.1"
        );
        assert_eq!(full.size_hint().lower(), 3);
        let (data, t) = collect(full).unwrap();
        assert_eq!(
            (data, t.unwrap()["grpc-status"].clone()),
            (Bytes::from_static(b"msg"), "0".parse().unwrap())
        );

        let rest = chunks(vec![Ok(Frame::data(Bytes::from_static(b"cd")))]);
        let prefixed = BufferedBody::prefixed(Bytes::from_static(b"ab"), Box::pin(rest));
        assert_eq!(collect(prefixed).unwrap().0, "abcd");

        let failed = BufferedBody::<Chunks>::failed(Bytes::from_static(b"ab"), "reset");
        assert_eq!(collect(failed), Err("reset"), "the error is not swallowed");

        let streaming =
            BufferedBody::streaming(chunks(vec![Ok(Frame::data(Bytes::from_static(b"x")))]));
        assert_eq!(collect(streaming).unwrap().0, "x");
        assert!(BufferedBody::<Chunks>::full(Bytes::new()).is_end_stream());
    }
}
