//! Where a topic's messages go: method, URI and headers, and the request built from them.

use super::error::HttpSendError;
use crate::message::OutboxMessage;
use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, AUTHORIZATION, PROXY_AUTHORIZATION};
use http::{HeaderMap, Method, Request, Uri};
use http_body_util::Full;
use tower_once_core::IDEMPOTENCY_KEY;

/// The HTTP request one topic's messages become: a method, a URI and headers, fixed when the
/// [`HttpSender`](super::HttpSender) is built. The message adds its dedupe key as the
/// `Idempotency-Key` header and its payload as the body.
///
/// ```
/// use http::header::{HeaderValue, AUTHORIZATION, CONTENT_TYPE};
/// use http::Uri;
/// use tower_once_outbox::http::Route;
///
/// let route = Route::post(Uri::from_static("https://mail.example.com/v1/send"))
///     .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
///     .header(AUTHORIZATION, HeaderValue::from_static("Bearer key_123"));
/// assert_eq!(route.method(), http::Method::POST);
/// assert_eq!(route.headers()[CONTENT_TYPE], "application/json");
/// ```
#[derive(Debug, Clone)]
pub struct Route {
    method: Method,
    uri: Uri,
    headers: HeaderMap,
}

impl Route {
    /// A route sending `method` requests to `uri`, without headers of its own.
    ///
    /// The URI is the client's to judge: most clients (hyper-util's, reqwest) need an absolute
    /// one, and a client whose layers add a base URI may take a path.
    pub fn new(method: Method, uri: Uri) -> Self {
        Self {
            method,
            uri,
            headers: HeaderMap::new(),
        }
    }

    /// `POST` to `uri`, the usual way to hand a provider a message.
    pub fn post(uri: Uri) -> Self {
        Self::new(Method::POST, uri)
    }

    /// `PUT` to `uri`.
    pub fn put(uri: Uri) -> Self {
        Self::new(Method::PUT, uri)
    }

    /// Adds a header to every request of this route (a repeated name adds a value). The
    /// message's `Idempotency-Key` replaces any the route sets: the dedupe key is the key.
    ///
    /// `Authorization` and `Proxy-Authorization` values are marked
    /// [sensitive](HeaderValue::set_sensitive), so `Debug` output does not show them.
    pub fn header(mut self, name: HeaderName, mut value: HeaderValue) -> Self {
        if name == AUTHORIZATION || name == PROXY_AUTHORIZATION {
            value.set_sensitive(true);
        }
        self.headers.append(name, value);
        self
    }

    /// The method.
    pub fn method(&self) -> &Method {
        &self.method
    }

    /// The URI.
    pub fn uri(&self) -> &Uri {
        &self.uri
    }

    /// The route's own headers.
    pub fn headers(&self) -> &HeaderMap {
        &self.headers
    }

    /// The request for `message`: this route's method, URI and headers, the dedupe key as its
    /// `Idempotency-Key`, the payload as its body.
    pub(crate) fn request(
        &self,
        message: &OutboxMessage,
    ) -> Result<Request<Full<Bytes>>, HttpSendError> {
        // Enqueued keys are visible ASCII; a row written around `Outbox::enqueue` may not be.
        let key = HeaderValue::from_str(message.dedupe_key())
            .map_err(|_| HttpSendError::invalid_key())?;
        let mut request = Request::new(Full::new(message.payload().clone()));
        *request.method_mut() = self.method.clone();
        *request.uri_mut() = self.uri.clone();
        let headers = request.headers_mut();
        headers.clone_from(&self.headers);
        headers.insert(IDEMPOTENCY_KEY, key);
        // NOTE: the message's extensions (the send's deadline, a retry attempt's mark) travel
        // on, so that layers under the sender, on this task or another, see them.
        *request.extensions_mut() = message.extensions().clone();
        Ok(request)
    }
}
