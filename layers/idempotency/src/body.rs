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

/// The response body of [`Idempotency`](crate::Idempotency): the inner service's body as it
/// streams, a stored or buffered response (with its trailers), or a buffered prefix followed
/// by the rest of a response too large to store.
///
/// ```
/// use http_body::Body as _;
/// use tower_once_idempotency::ResponseBody;
///
/// let body = ResponseBody::<axum::body::Body>::full("{}".into());
/// assert_eq!(body.size_hint().exact(), Some(2));
/// ```
pub type ResponseBody<B> = BufferedBody<B>;
