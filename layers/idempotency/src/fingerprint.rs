//! Request fingerprints: how the layer tells "the same request again" from "a different request
//! that reuses a key".
//!
//! The default, [`Sha256Fingerprint`], hashes the method, the path and query, and the body bytes.
//! A retry must send all three unchanged to be replayed; anything else answers
//! `422 Unprocessable Content`, as the IETF draft requires.
//!
//! Replace it with [`IdempotencyLayer::fingerprint_with`](crate::IdempotencyLayer::fingerprint_with)
//! when some part of a request may legitimately change between attempts (for example a
//! client-side timestamp in a JSON body). Any `Fn(&request::Parts, &Bytes) -> Fingerprint`
//! closure is a [`Fingerprinter`].

use bytes::Bytes;
use http::request::Parts;
use sha2::{Digest, Sha256};
use std::fmt;

/// A 32-byte digest identifying a request's content.
///
/// ```
/// use tower_once_idempotency::fingerprint::Fingerprint;
///
/// let fp = Fingerprint::from_bytes([7; 32]);
/// assert_eq!(fp.as_bytes(), &[7; 32]);
/// assert_eq!(fp.to_string().len(), 64);
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint([u8; 32]);

impl Fingerprint {
    /// Wraps 32 digest bytes.
    pub const fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    /// The digest bytes.
    pub const fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        crate::digest::write_hex(f, &self.0)
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({self})")
    }
}

/// Computes the [`Fingerprint`] of a buffered request.
///
/// Implemented for every `Fn(&http::request::Parts, &Bytes) -> Fingerprint`.
///
/// ```
/// use bytes::Bytes;
/// use tower_once_idempotency::fingerprint::{Fingerprint, Fingerprinter, Sha256Fingerprint};
///
/// // Ignore the body: a retry may change it freely (its first version wins).
/// let method_and_path = |parts: &http::request::Parts, _body: &Bytes| {
///     Sha256Fingerprint.fingerprint(parts, &Bytes::new())
/// };
/// let (parts, ()) = http::Request::post("/charges").body(()).unwrap().into_parts();
/// assert_eq!(
///     method_and_path.fingerprint(&parts, &Bytes::from("a")),
///     method_and_path.fingerprint(&parts, &Bytes::from("b")),
/// );
/// ```
pub trait Fingerprinter {
    /// The fingerprint of the request made of `parts` and `body`.
    fn fingerprint(&self, parts: &Parts, body: &Bytes) -> Fingerprint;
}

impl<F> Fingerprinter for F
where
    F: Fn(&Parts, &Bytes) -> Fingerprint,
{
    fn fingerprint(&self, parts: &Parts, body: &Bytes) -> Fingerprint {
        self(parts, body)
    }
}

/// The default fingerprint: SHA-256 over the method, the path and query, and the body.
///
/// Each part is length-prefixed, so no two different requests share an input.
///
/// ```
/// use bytes::Bytes;
/// use tower_once_idempotency::fingerprint::{Fingerprinter, Sha256Fingerprint};
///
/// let parts = |uri: &str| http::Request::post(uri).body(()).unwrap().into_parts().0;
/// let body = Bytes::from_static(b"{\"amount\":5}");
/// assert_eq!(
///     Sha256Fingerprint.fingerprint(&parts("/a?x=1"), &body),
///     Sha256Fingerprint.fingerprint(&parts("/a?x=1"), &body),
/// );
/// assert_ne!(
///     Sha256Fingerprint.fingerprint(&parts("/a?x=1"), &body),
///     Sha256Fingerprint.fingerprint(&parts("/a?x=2"), &body),
/// );
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct Sha256Fingerprint;

impl Fingerprinter for Sha256Fingerprint {
    fn fingerprint(&self, parts: &Parts, body: &Bytes) -> Fingerprint {
        let mut hasher = Sha256::new();
        hasher.update(b"tower-once/fingerprint/v1");
        crate::digest::update_framed(&mut hasher, parts.method.as_str().as_bytes());
        // The path as the record key names it, then the query as sent.
        let path = crate::path::addressed(parts);
        match parts.uri.query() {
            Some(query) => crate::digest::update_framed_parts(
                &mut hasher,
                &[path.as_bytes(), b"?", query.as_bytes()],
            ),
            None => crate::digest::update_framed(&mut hasher, path.as_bytes()),
        }
        crate::digest::update_framed(&mut hasher, body);
        Fingerprint(hasher.finalize().into())
    }
}
