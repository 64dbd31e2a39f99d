//! What a delivered message's provider answered.

use bytes::Bytes;
use http::response::Parts;
use http::{HeaderMap, StatusCode};

/// The answer to a message the [`HttpSender`](super::HttpSender) delivered: a status its
/// classifier called a success. The relay records the row as sent and drops this; a layer
/// around the sender can read it.
///
/// It is not an `http::Response`, on purpose: the sender has classified the answer already,
/// and giving the relay an HTTP classifier as well fails to compile rather than overruling it.
#[derive(Debug, Clone)]
pub struct Delivered {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

impl Delivered {
    pub(super) fn new(parts: Parts, body: Bytes) -> Self {
        Self {
            status: parts.status,
            headers: parts.headers,
            body,
        }
    }

    /// The provider's status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The provider's response headers.
    pub fn headers(&self) -> &HeaderMap {
        &self.headers
    }

    /// The start of the provider's response body: up to 64 KiB, read while the send's deadline
    /// allowed (a body that fails or arrives too slowly is cut, and the message still counts
    /// as delivered).
    pub fn body(&self) -> &Bytes {
        &self.body
    }
}
