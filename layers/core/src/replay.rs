//! Reading an HTTP request's body so that the request can be sent again: the one mechanism the
//! retry layer, the fallback and the hedging layer share.
//!
//! | the body | [`ReadForReplay`] gives |
//! |---|---|
//! | ends within the limit | [`Read::Whole`]: a [`ReplayRequest`], sent as many times as needed |
//! | passes the limit | [`Read::Once`]: the bytes read so far, then the rest of the body (a request to send once) |
//! | fails while read | [`Read::Once`]: the bytes read so far, then the body's error (never a truncated body passed off as whole) |
//! | stalls past the deadline | [`Read::Elapsed`]: the bytes read so far, then the rest of the body |
//!
//! Request trailers are not kept.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! use bytes::Bytes;
//! use http_body_util::Full;
//! use tower_once_core::replay::{Read, ReadForReplay, DEFAULT_BODY_LIMIT};
//!
//! let req = http::Request::post("/charges").body(Full::new(Bytes::from_static(b"{}"))).unwrap();
//! let Read::Whole(replay) = ReadForReplay::new(req, DEFAULT_BODY_LIMIT, None).await else {
//!     unreachable!("a small body is read whole")
//! };
//! let first: http::Request<tower_once_core::body::BufferedBody<Full<Bytes>>> = replay.copy();
//! assert_eq!(first.method(), "POST");
//! assert_eq!(replay.body(), "{}");
//! # }
//! ```

use crate::body::{BufferedBody, Collected, Collector};
use crate::carrier::Carrier;
use bytes::Bytes;
use http::request::Parts;
use http::{Extensions, HeaderMap, Method, Request, Uri, Version};
use http_body::Body;
use pin_project_lite::pin_project;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use tokio::time::{Instant, Sleep};

/// The most request-body bytes a layer holds to send a request again, unless told otherwise:
/// 1 MiB, the idempotency layer's own limit, so anything that server accepts can be resent.
pub const DEFAULT_BODY_LIMIT: usize = 1024 * 1024;

/// A request whose body was read whole: its parts and its bytes, sent as often as needed.
#[derive(Debug, Clone)]
pub struct ReplayRequest {
    method: Method,
    uri: Uri,
    version: Version,
    headers: HeaderMap,
    extensions: Extensions,
    body: Bytes,
}

impl ReplayRequest {
    /// The request made of `parts` and the whole of its body, `body`.
    pub fn new(parts: Parts, body: Bytes) -> Self {
        Self {
            method: parts.method,
            uri: parts.uri,
            version: parts.version,
            headers: parts.headers,
            extensions: parts.extensions,
            body,
        }
    }

    /// The whole body.
    pub fn body(&self) -> &Bytes {
        &self.body
    }

    /// The headers.
    pub fn headers(&self) -> &HeaderMap {
        &self.headers
    }

    /// The method.
    pub fn method(&self) -> &Method {
        &self.method
    }

    /// A copy, as an `http::Request` (the bytes are shared, not copied).
    pub fn copy<B: Body>(&self) -> Request<BufferedBody<B>> {
        self.clone().into_request()
    }

    /// This request, as an `http::Request`.
    pub fn into_request<B: Body>(self) -> Request<BufferedBody<B>> {
        let mut req = Request::new(BufferedBody::full(self.body));
        *req.method_mut() = self.method;
        *req.uri_mut() = self.uri;
        *req.version_mut() = self.version;
        *req.headers_mut() = self.headers;
        *req.extensions_mut() = self.extensions;
        req
    }
}

impl Carrier for ReplayRequest {
    fn extensions(&self) -> Option<&Extensions> {
        Some(&self.extensions)
    }

    fn extensions_mut(&mut self) -> Option<&mut Extensions> {
        Some(&mut self.extensions)
    }

    fn may_send_twice(&self) -> bool {
        crate::resend::may_resend_parts(&self.method, &self.headers, &self.extensions)
    }
}

/// What [`ReadForReplay`] read.
#[derive(Debug)]
pub enum Read<B: Body> {
    /// The whole body: the request can be sent again.
    Whole(ReplayRequest),
    /// The body passed the limit or failed: the request with the bytes read so far, then the
    /// rest of its body (or its error), to send once.
    Once(Request<BufferedBody<B>>),
    /// The deadline passed while the body was still arriving: the request with the bytes read
    /// so far, then the rest of its body.
    Elapsed(Request<BufferedBody<B>>),
}

pin_project! {
    /// Reads a request's body up to a limit, and at most until a deadline. See the
    /// [module docs](self).
    pub struct ReadForReplay<B> {
        parts: Option<Parts>,
        body: Option<Pin<Box<B>>>,
        collected: Collector,
        limit: usize,
        deadline: Option<Instant>,
        // Armed when the body first stalls: a body that arrives at once needs no timer.
        #[pin]
        cutoff: Option<Sleep>,
    }
}

impl<B: Body> ReadForReplay<B> {
    /// Reads `req`'s body, keeping at most `limit` bytes, until `deadline` (none: as long as
    /// the body takes).
    pub fn new(req: Request<B>, limit: usize, deadline: Option<Instant>) -> Self {
        let (parts, body) = req.into_parts();
        Self {
            parts: Some(parts),
            body: Some(Box::pin(body)),
            collected: Collector::default(),
            limit,
            deadline,
            cutoff: None,
        }
    }

    /// Whether `req` needs no read: its body is already at its end (a `GET`), so it becomes a
    /// [`ReplayRequest`] at once ([`ReplayRequest::new`] with no bytes), with no allocation.
    pub fn is_ended(req: &Request<B>) -> bool {
        req.body().is_end_stream()
    }
}

impl<B> std::fmt::Debug for ReadForReplay<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadForReplay")
            .field("read", &self.collected.len())
            .field("limit", &self.limit)
            .field("deadline", &self.deadline)
            .finish()
    }
}

impl<B: Body<Data = Bytes>> Future for ReadForReplay<B> {
    type Output = Read<B>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Read<B>> {
        let mut this = self.project();
        let Some(body) = this.body.as_mut() else {
            crate::polled_after_completion("ReadForReplay");
        };
        let mut trailers = None;
        let Poll::Ready(outcome) =
            this.collected
                .poll_collect(body.as_mut(), *this.limit, &mut trailers, cx)
        else {
            // A body that stalls is still inside the deadline.
            let Some(deadline) = *this.deadline else {
                return Poll::Pending;
            };
            if this.cutoff.is_none() {
                this.cutoff.set(Some(tokio::time::sleep_until(deadline)));
            }
            if let Some(cutoff) = this.cutoff.as_mut().as_pin_mut() {
                ready!(cutoff.poll(cx));
            }
            let read = std::mem::take(this.collected).finish();
            let (parts, rest) = take(this.parts, this.body);
            let body = BufferedBody::prefixed(read, rest);
            return Poll::Ready(Read::Elapsed(Request::from_parts(parts, body)));
        };
        this.cutoff.set(None);
        let collected = std::mem::take(this.collected);
        let (parts, rest) = take(this.parts, this.body);
        Poll::Ready(match outcome {
            Collected::Complete => Read::Whole(ReplayRequest::new(parts, collected.finish())),
            Collected::Over(chunk) => {
                tracing::debug!("request body over the limit: sent once");
                let body = BufferedBody::prefixed(collected.finish_with(chunk), rest);
                Read::Once(Request::from_parts(parts, body))
            }
            Collected::Failed(error) => {
                // NOTE: never a truncated body passed off as whole: the service sees the bytes
                // read so far, then the error.
                tracing::debug!("request body failed while read: sent once");
                let body = BufferedBody::failed(collected.finish(), error);
                Read::Once(Request::from_parts(parts, body))
            }
        })
    }
}

/// The request's parts and body, taken once the read ended.
fn take<B>(parts: &mut Option<Parts>, body: &mut Option<Pin<Box<B>>>) -> (Parts, Pin<Box<B>>) {
    match (parts.take(), body.take()) {
        (Some(parts), Some(body)) => (parts, body),
        _ => crate::polled_after_completion("ReadForReplay"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, Full, StreamBody};
    use std::time::Duration;

    type Frames = futures_util::stream::Pending<Result<http_body::Frame<Bytes>, std::io::Error>>;

    #[tokio::test(start_paused = true)]
    async fn a_stalled_body_is_given_back_at_the_deadline_with_what_was_read() {
        let body = StreamBody::new(futures_util::stream::pending::<
            Result<http_body::Frame<Bytes>, std::io::Error>,
        >());
        let req: Request<StreamBody<Frames>> = Request::post("/x").body(body).unwrap();
        let started = Instant::now();
        let deadline = started + Duration::from_secs(1);
        let read = ReadForReplay::new(req, DEFAULT_BODY_LIMIT, Some(deadline)).await;
        assert!(matches!(read, Read::Elapsed(_)));
        assert_eq!(started.elapsed(), Duration::from_secs(1));
    }

    #[tokio::test]
    async fn over_the_limit_is_sent_once_with_every_byte() {
        let req = Request::post("/x")
            .body(Full::new(Bytes::from_static(b"0123456789")))
            .unwrap();
        let Read::Once(req) = ReadForReplay::new(req, 4, None).await else {
            panic!("over the limit");
        };
        let bytes = req.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(bytes, "0123456789");
    }

    #[test]
    fn an_ended_body_needs_no_read() {
        let req = Request::get("/x").body(Full::new(Bytes::new())).unwrap();
        assert!(ReadForReplay::is_ended(&req));
        let replay = ReplayRequest::new(req.into_parts().0, Bytes::new());
        assert!(replay.body().is_empty());
        assert!(replay.may_send_twice());
    }
}
