//! Request fingerprints: how the layer tells "the same request again" from "a different request
//! that reuses a key".
//!
//! The default, [`Xxh3Fingerprint`], hashes the method, the path and query, and the body bytes.
//! A retry must send all three unchanged to be replayed; anything else answers
//! `422 Unprocessable Content`, as the IETF draft requires.
//!
//! Why a fast non-cryptographic hash is enough: a fingerprint is only ever compared with the
//! record of the same key in the same scope (the record's key itself is SHA-256 over the scope,
//! the route and the key, so no tenant reaches another's records). By chance two requests
//! collide 1 in 2¹²⁸; on purpose it is easy (xxh3 has no secret: a client can build two
//! different bodies with one fingerprint in microseconds). Either way the only effect is on
//! that client's own key: its second, different request gets its first one's answer instead
//! of a `422`, and nothing runs twice. Where a client must not be able to do even that (the
//! `422` is a check you rely on, not a courtesy), use [`Sha256Fingerprint`]. Each fingerprint
//! carries its kind, and each of the two recognizes the other's records, so changing from one
//! to the other in a deploy never turns in-flight retries into `422`.
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

    /// Whether `stored`, which differs from this request's [`fingerprint`](Self::fingerprint),
    /// is still this request's, computed another way (by an earlier default): asked only
    /// before answering `422`. `false` unless overridden.
    fn recognizes(&self, parts: &Parts, body: &Bytes, stored: &Fingerprint) -> bool {
        let _ = (parts, body, stored);
        false
    }
}

impl<F> Fingerprinter for F
where
    F: Fn(&Parts, &Bytes) -> Fingerprint,
{
    fn fingerprint(&self, parts: &Parts, body: &Bytes) -> Fingerprint {
        self(parts, body)
    }
}

/// SHA-256 over the method, the path and query, and the body: the default before
/// [`Xxh3Fingerprint`], for deployments that want a collision-resistant fingerprint (no client
/// can then make two different requests look alike). It recognizes records stored under
/// [`Xxh3Fingerprint`].
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
        feed_request(b"tower-once/fingerprint/v1", parts, body, |bytes| {
            hasher.update(bytes)
        });
        Fingerprint(hasher.finalize().into())
    }

    /// A record stored under [`Xxh3Fingerprint`] (the default) is recognized, so that moving
    /// to SHA-256 does not turn in-flight retries into `422`.
    fn recognizes(&self, parts: &Parts, body: &Bytes, stored: &Fingerprint) -> bool {
        stored.0[16..] == *XXH3_TAG && Xxh3Fingerprint.fingerprint(parts, body) == *stored
    }
}

/// What every fingerprint hashes, fed to `feed` after `domain`: the method, the path as the
/// record key names it with the query as sent, and the body, each behind its length, so that
/// no two different requests share an input.
fn feed_request(domain: &[u8], parts: &Parts, body: &[u8], mut feed: impl FnMut(&[u8])) {
    feed(domain);
    let mut framed = |pieces: &[&[u8]]| {
        let len: usize = pieces.iter().map(|piece| piece.len()).sum();
        feed(&(len as u64).to_be_bytes());
        for piece in pieces {
            feed(piece);
        }
    };
    framed(&[parts.method.as_str().as_bytes()]);
    let path = crate::path::addressed(parts);
    match parts.uri.query() {
        Some(query) => framed(&[path.as_bytes(), b"?", query.as_bytes()]),
        None => framed(&[path.as_bytes()]),
    }
    framed(&[body]);
}

/// The default fingerprint: xxh3-128 over the method, the path and query, and the body, each
/// part length-prefixed; the 16 digest bytes are followed by a tag naming the kind. A stored
/// fingerprint of [`Sha256Fingerprint`] (the earlier default) is [recognized](Fingerprinter::recognizes):
/// the request's SHA-256 is computed then, only on that path.
///
/// ```
/// use bytes::Bytes;
/// use tower_once_idempotency::fingerprint::{Fingerprinter, Sha256Fingerprint, Xxh3Fingerprint};
///
/// let (parts, ()) = http::Request::post("/charges").body(()).unwrap().into_parts();
/// let body = Bytes::from_static(b"{\"amount\":5}");
/// let fast = Xxh3Fingerprint.fingerprint(&parts, &body);
/// assert_eq!(fast, Xxh3Fingerprint.fingerprint(&parts, &body));
/// assert_ne!(fast, Xxh3Fingerprint.fingerprint(&parts, &Bytes::from_static(b"{}")));
/// // A record stored under SHA-256 before an upgrade still matches its retry.
/// let before = Sha256Fingerprint.fingerprint(&parts, &body);
/// assert!(Xxh3Fingerprint.recognizes(&parts, &body, &before));
/// assert!(!Xxh3Fingerprint.recognizes(&parts, &Bytes::new(), &before));
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct Xxh3Fingerprint;

/// The second half of an [`Xxh3Fingerprint`]: its kind and version.
const XXH3_TAG: &[u8; 16] = b"tower-once xxh3\x01";

impl Fingerprinter for Xxh3Fingerprint {
    fn fingerprint(&self, parts: &Parts, body: &Bytes) -> Fingerprint {
        let mut hasher = xxhash_rust::xxh3::Xxh3Default::new();
        feed_request(b"tower-once/fingerprint/xxh3/v1", parts, body, |bytes| {
            hasher.update(bytes)
        });
        let mut bytes = [0u8; 32];
        bytes[..16].copy_from_slice(&hasher.digest128().to_be_bytes());
        bytes[16..].copy_from_slice(XXH3_TAG);
        Fingerprint(bytes)
    }

    fn recognizes(&self, parts: &Parts, body: &Bytes, stored: &Fingerprint) -> bool {
        stored.0[16..] != *XXH3_TAG && Sha256Fingerprint.fingerprint(parts, body) == *stored
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pinned(fp: &impl Fingerprinter) -> String {
        let parts = http::Request::post("/charges?x=1")
            .body(())
            .unwrap()
            .into_parts()
            .0;
        fp.fingerprint(&parts, &Bytes::from_static(b"{\"amount\":5}"))
            .to_string()
    }

    #[test]
    fn fingerprints_are_stable_across_versions() {
        // Stored records are compared with these: a change here turns retries into `422`.
        assert_eq!(
            pinned(&Sha256Fingerprint),
            "c0cf165a1b9afb64e6fa9efe042fb7e37fdd88adcb1068e3b65f49d864dd4852"
        );
        assert_eq!(
            pinned(&Xxh3Fingerprint),
            "a3cbf8b7fe455c8d1652c8a7ec13e6e9746f7765722d6f6e6365207878683301"
        );
    }
}
