//! The identity of a record, and the token that owns a claim.

use std::fmt;

/// The identity of a record: SHA-256 of the scope, method, path and idempotency key.
///
/// The path is the one the client addressed: behind an axum `Router::nest` (or a `route_layer`
/// inside one) the layer sees a path stripped of the nest prefix, so it reads axum's
/// `OriginalUri` extension instead, in every build of the crate (axum 0.8).
/// Two nested routers sharing one store, or `/accounts/{a}/..` and `/accounts/{b}/..` behind
/// one nested router, never share a record.
///
/// A key also carries a tag of its scope, which the [`MemoryStore`](super::MemoryStore) uses to share its room
/// fairly between scopes; the tag is not part of the key's identity (equality, hashing and
/// [`Display`](fmt::Display) use the digest alone).
///
/// Its [`Display`](fmt::Display) form (64 lowercase hex digits) is what stores use as a key name.
///
/// ```
/// use tower_once_idempotency::store::StoreKey;
///
/// let (parts, ()) = http::Request::post("/charges?x=1").body(()).unwrap().into_parts();
/// let a = StoreKey::derive(b"tenant-a", &parts, "k1");
/// let b = StoreKey::derive(b"tenant-b", &parts, "k1");
/// assert_ne!(a, b, "tenants never share keys");
/// assert_eq!(a.to_string().len(), 64);
/// ```
#[derive(Clone, Copy)]
pub struct StoreKey {
    digest: [u8; 32],
    scope_tag: u64,
}

impl PartialEq for StoreKey {
    fn eq(&self, other: &Self) -> bool {
        self.digest == other.digest
    }
}

impl Eq for StoreKey {}

impl std::hash::Hash for StoreKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        // The digest is SHA-256: its first 128 bits identify it as well as all 256 do for a
        // hash table, and half the bytes cost a keyed hasher half the work.
        let [a, b, c, d, e, f, g, h, i, j, k, l, m, n, o, p, ..] = self.digest;
        state.write_u128(u128::from_le_bytes([
            a, b, c, d, e, f, g, h, i, j, k, l, m, n, o, p,
        ]));
    }
}

impl PartialOrd for StoreKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for StoreKey {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.digest.cmp(&other.digest)
    }
}

impl StoreKey {
    /// Derives the key of a request from its scope, method, path as the client addressed it
    /// (without the query) and idempotency key.
    pub fn derive(scope: &[u8], parts: &http::request::Parts, key: &str) -> Self {
        use crate::digest::update_framed;
        use sha2::{Digest, Sha256};
        let mut hasher = Sha256::new();
        hasher.update(b"tower-once/key/v1");
        update_framed(&mut hasher, scope);
        update_framed(&mut hasher, parts.method.as_str().as_bytes());
        update_framed(&mut hasher, crate::path::addressed(parts).as_bytes());
        update_framed(&mut hasher, key.as_bytes());
        Self {
            digest: hasher.finalize().into(),
            scope_tag: scope_tag(scope),
        }
    }

    /// Wraps 32 raw bytes (for stores that read keys back, and for tests), in the empty scope.
    pub const fn from_bytes(bytes: [u8; 32]) -> Self {
        Self {
            digest: bytes,
            scope_tag: 0,
        }
    }

    /// The same key, tagged as belonging to `scope` (for stores that share room by scope).
    pub fn with_scope(self, scope: &[u8]) -> Self {
        Self {
            scope_tag: scope_tag(scope),
            ..self
        }
    }

    /// The raw bytes.
    pub const fn as_bytes(&self) -> &[u8; 32] {
        &self.digest
    }

    /// A tag of the key's scope: equal for keys of one scope within one process (it is a
    /// keyed hash, so it means nothing to another process and a client cannot aim at another
    /// scope's tag). `0` for the empty scope.
    pub fn scope_tag(&self) -> u64 {
        self.scope_tag
    }
}

fn scope_tag(scope: &[u8]) -> u64 {
    use std::hash::BuildHasher;
    use std::sync::OnceLock;
    static KEYS: OnceLock<std::collections::hash_map::RandomState> = OnceLock::new();
    if scope.is_empty() {
        return 0;
    }
    KEYS.get_or_init(Default::default).hash_one(scope)
}

impl fmt::Display for StoreKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        crate::digest::write_hex(f, &self.digest)
    }
}

impl fmt::Debug for StoreKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "StoreKey({self})")
    }
}

/// The random token that owns a claim, fencing every later write to the record.
///
/// The layer inserts it into the request's extensions before calling the handler, so the handler
/// can fence its own writes with it (for example store it beside the row it inserts, and refuse
/// to commit when a newer token owns the key).
///
/// ```
/// use tower_once_idempotency::store::ClaimToken;
///
/// async fn handler(req: http::Request<()>) {
///     if let Some(token) = req.extensions().get::<ClaimToken>() {
///         println!("running under claim {token}");
///     }
/// }
/// assert_ne!(ClaimToken::new(), ClaimToken::new());
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ClaimToken(uuid::Uuid);

impl ClaimToken {
    /// A fresh random (version 4 UUID) token.
    #[allow(clippy::new_without_default)]
    pub fn new() -> Self {
        Self(uuid::Uuid::new_v4())
    }

    /// Wraps a token read back from a store.
    pub const fn from_uuid(uuid: uuid::Uuid) -> Self {
        Self(uuid)
    }

    /// The token as a UUID.
    pub const fn as_uuid(&self) -> &uuid::Uuid {
        &self.0
    }
}

impl fmt::Display for ClaimToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0.hyphenated(), f)
    }
}

impl fmt::Debug for ClaimToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ClaimToken({self})")
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn keys_and_fingerprints_print_as_lowercase_hex() {
        let bytes: [u8; 32] = std::array::from_fn(|i| (i * 8) as u8 | (i as u8 >> 1));
        let expected: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(super::StoreKey::from_bytes(bytes).to_string(), expected);
        assert_eq!(
            crate::fingerprint::Fingerprint::from_bytes(bytes).to_string(),
            expected
        );
        assert_eq!(
            super::StoreKey::from_bytes([0xff; 32]).to_string(),
            "f".repeat(64)
        );
    }
}
