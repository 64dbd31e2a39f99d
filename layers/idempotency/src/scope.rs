//! Scopes: whose keys are whose.
//!
//! Two requests share a record only when their scope, method, path and key are all equal. The
//! scope is what separates tenants or principals: with a scope of the authenticated account, one
//! account can never replay, block or probe another account's keys, even if both pick the same
//! key string. Without a scope (the default, `()`), every client shares one key space, which is
//! right only for a single-tenant service.
//!
//! Any `Fn(&http::request::Parts) -> T` where `T: AsRef<[u8]>` is a [`Scope`]. It runs before the
//! body is read, so it can use headers and the extensions that an authentication layer placed
//! *outside* this one has set.
//!
//! ```
//! use http::request::Parts;
//! use tower_once_idempotency::IdempotencyLayer;
//!
//! #[derive(Clone)]
//! struct Tenant(String);
//!
//! // Scope by the tenant that an auth layer (run before this one) put in the extensions.
//! let layer = IdempotencyLayer::new().scope(|parts: &Parts| {
//!     parts.extensions.get::<Tenant>().map(|t| t.0.clone()).unwrap_or_default()
//! });
//! # let _ = layer;
//! ```

use http::request::Parts;

/// Extracts the scope of a request. See the [module docs](self).
pub trait Scope {
    /// The scope bytes.
    type Output: AsRef<[u8]>;

    /// The scope of the request made of `parts`.
    fn scope(&self, parts: &Parts) -> Self::Output;
}

/// No scope: one key space for every client.
impl Scope for () {
    type Output = [u8; 0];

    fn scope(&self, _: &Parts) -> [u8; 0] {
        []
    }
}

impl<F, T> Scope for F
where
    F: Fn(&Parts) -> T,
    T: AsRef<[u8]>,
{
    type Output = T;

    fn scope(&self, parts: &Parts) -> T {
        self(parts)
    }
}

/// Scopes by the value of a request header (empty when absent), for services whose gateway sets
/// a trusted tenant or principal header.
///
/// ```
/// use tower_once_idempotency::{scope::HeaderScope, IdempotencyLayer};
///
/// let layer = IdempotencyLayer::new().scope(HeaderScope::new("x-tenant-id"));
/// # let _ = layer;
/// ```
#[derive(Debug, Clone)]
pub struct HeaderScope {
    name: http::HeaderName,
}

impl HeaderScope {
    /// Scopes by the header `name`.
    ///
    /// # Panics
    ///
    /// If `name` is not a valid header name.
    pub fn new(name: &str) -> Self {
        match http::HeaderName::try_from(name) {
            Ok(name) => Self { name },
            Err(_) => panic!("HeaderScope::new: {name:?} is not a valid header name"),
        }
    }
}

impl Scope for HeaderScope {
    type Output = http::HeaderValue;

    fn scope(&self, parts: &Parts) -> http::HeaderValue {
        // A clone shares the header's bytes; an absent header is the empty scope.
        parts
            .headers
            .get(&self.name)
            .cloned()
            .unwrap_or_else(|| http::HeaderValue::from_static(""))
    }
}
