//! A request being built for a [`Client`](super::Client).

use super::error::Error;
use super::pending::Pending;
use super::stack::Stack;
use http::header::{HeaderMap, HeaderName, HeaderValue};
use std::fmt;
use std::time::Duration;
use tower::ServiceExt;
use tower_once_core::resend::SafeToRetry;
use tower_once_core::IDEMPOTENCY_KEY;
use tower_once_timeout::Deadline;

/// A request for a [`Client`](super::Client): reqwest's `RequestBuilder`, plus what the retry layer reads
/// (a per-request deadline, "safe to retry", an idempotency key).
#[must_use = "a request does nothing until it is sent"]
pub struct RequestBuilder {
    stack: Stack,
    inner: reqwest::RequestBuilder,
    extensions: http::Extensions,
}

impl RequestBuilder {
    pub(super) fn new(stack: Stack, inner: reqwest::RequestBuilder) -> Self {
        Self {
            stack,
            inner,
            extensions: http::Extensions::new(),
        }
    }

    /// Adds a header (as `reqwest::RequestBuilder::header`).
    pub fn header<K, V>(mut self, key: K, value: V) -> Self
    where
        HeaderName: TryFrom<K>,
        <HeaderName as TryFrom<K>>::Error: Into<http::Error>,
        HeaderValue: TryFrom<V>,
        <HeaderValue as TryFrom<V>>::Error: Into<http::Error>,
    {
        self.inner = self.inner.header(key, value);
        self
    }

    /// Adds headers (as `reqwest::RequestBuilder::headers`).
    pub fn headers(mut self, headers: HeaderMap) -> Self {
        self.inner = self.inner.headers(headers);
        self
    }

    /// HTTP basic authentication.
    pub fn basic_auth<U: fmt::Display, P: fmt::Display>(
        mut self,
        username: U,
        password: Option<P>,
    ) -> Self {
        self.inner = self.inner.basic_auth(username, password);
        self
    }

    /// Bearer authentication.
    pub fn bearer_auth<T: fmt::Display>(mut self, token: T) -> Self {
        self.inner = self.inner.bearer_auth(token);
        self
    }

    /// The body. A body up to the retry layer's replay limit (1 MiB by default) is buffered so
    /// that it can be sent again; a larger one is sent once.
    pub fn body<T: Into<reqwest::Body>>(mut self, body: T) -> Self {
        self.inner = self.inner.body(body);
        self
    }

    /// A JSON body, with `Content-Type: application/json`.
    pub fn json<T: serde::Serialize + ?Sized>(mut self, json: &T) -> Self {
        self.inner = self.inner.json(json);
        self
    }

    /// The HTTP version.
    pub fn version(mut self, version: http::Version) -> Self {
        self.inner = self.inner.version(version);
        self
    }

    /// Anything else reqwest's builder offers (`query`, `form`, `multipart` with their reqwest
    /// features, ...).
    ///
    /// ```no_run
    /// # fn f(client: tower_once_retry::reqwest::Client) {
    /// let request = client
    ///     .get("http://127.0.0.1:3000/charges")
    ///     .with(|b| b.header("x-trace", "1"));
    /// # let _ = request;
    /// # }
    /// ```
    pub fn with(
        mut self,
        f: impl FnOnce(reqwest::RequestBuilder) -> reqwest::RequestBuilder,
    ) -> Self {
        self.inner = f(self.inner);
        self
    }

    /// The `Idempotency-Key` to send on every attempt: makes a `POST` or `PATCH` retryable, and
    /// lets an idempotency server run it once.
    pub fn idempotency_key(self, key: &str) -> Self {
        self.header(IDEMPOTENCY_KEY, key)
    }

    /// Marks the request safe to send more than once (its effect is idempotent, or it has none:
    /// an LLM completion), so a `POST` is retried without an `Idempotency-Key` being sent. See
    /// [`SafeToRetry`].
    pub fn safe_to_retry(mut self) -> Self {
        self.extensions.insert(SafeToRetry);
        self
    }

    /// A deadline for this request, over all its attempts and waits, when it is sooner than the
    /// retry layer's own.
    pub fn deadline(mut self, within: Duration) -> Self {
        let deadline = Deadline::after(within);
        let earliest = self
            .extensions
            .get::<Deadline>()
            .map_or(deadline, |d| (*d).min(deadline));
        self.extensions.insert(earliest);
        self
    }

    /// Builds the request (without sending it).
    pub fn build(self) -> Result<reqwest::Request, Error> {
        self.inner.build().map_err(Error::build)
    }

    /// Sends the request through the retry and timeout layers.
    pub fn send(self) -> Pending {
        let request = self
            .inner
            .build()
            .and_then(http::Request::<reqwest::Body>::try_from);
        match request {
            Ok(mut request) => {
                request.extensions_mut().extend(self.extensions);
                Pending::sending(self.stack.oneshot(request))
            }
            Err(error) => Pending::failed(Error::build(error)),
        }
    }
}

impl fmt::Debug for RequestBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RequestBuilder")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}
