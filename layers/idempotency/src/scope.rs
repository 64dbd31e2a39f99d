//! Scopes: whose keys are whose.
//!
//! Two requests share a record only when their scope, method, path and key are all equal. The
//! scope is what separates tenants or principals: with a scope of the authenticated account, one
//! account can never replay, block or probe another account's keys, even if both pick the same
//! key string.
//!
//! A scope **fails closed**: when it cannot tell whose request it is (no tenant header, no
//! principal in the extensions), it returns `None` and the layer refuses the keyed request with
//! `401` (problem type `urn:tower-once:idempotency:missing-scope`; gRPC `UNAUTHENTICATED`)
//! without running the handler. A request without a tenant never falls into a key space that
//! other tenant-less requests share, unless the scope says so explicitly
//! ([`HeaderScope::allow_missing`], or a closure that returns `Some` for them). Requests without
//! an `Idempotency-Key` are not scoped at all: they pass through (or get `400` with
//! [`require_key`](crate::IdempotencyLayer::require_key)).
//!
//! | scope | a request with a tenant | a request without one |
//! |---|---|---|
//! | `()` (the default) | one key space for every client: a single-tenant service | the same key space |
//! | [`HeaderScope::new`] | the header's value | `401`, handler not run |
//! | [`HeaderScope::allow_missing`] | the header's value | one shared scope for all such requests |
//! | a closure returning `Option<T>` | `Some(tenant)` | `None`: `401`, handler not run |
//!
//! Any `Fn(&http::request::Parts) -> Option<T>` where `T: AsRef<[u8]>` is a [`Scope`]. It runs
//! before the body is read, so it can use headers and the extensions that an authentication
//! layer placed *outside* this one has set. If the authentication layer ends up inside this one
//! by mistake (easy with axum, where the last `.layer` call is the outermost), every keyed
//! request is refused, and no record is ever shared between tenants.
//!
//! ```
//! use http::request::Parts;
//! use tower_once_idempotency::IdempotencyLayer;
//!
//! #[derive(Clone)]
//! struct Tenant(String);
//!
//! // Scope by the tenant that an auth layer (run before this one) put in the extensions;
//! // a request without one is refused.
//! let layer = IdempotencyLayer::new()
//!     .scope(|parts: &Parts| parts.extensions.get::<Tenant>().map(|t| t.0.clone()));
//! # let _ = layer;
//! ```

use http::request::Parts;

/// Extracts the scope of a request, or refuses it. See the [module docs](self).
pub trait Scope {
    /// The scope bytes.
    type Output: AsRef<[u8]>;

    /// The scope of the request made of `parts`; `None` when the request has none (no tenant,
    /// no principal): the layer then refuses it with `401` and does not run the handler.
    fn scope(&self, parts: &Parts) -> Option<Self::Output>;
}

/// No scope: one key space for every client, for a single-tenant service.
impl Scope for () {
    type Output = [u8; 0];

    fn scope(&self, _: &Parts) -> Option<[u8; 0]> {
        Some([])
    }
}

impl<F, T> Scope for F
where
    F: Fn(&Parts) -> Option<T>,
    T: AsRef<[u8]>,
{
    type Output = T;

    fn scope(&self, parts: &Parts) -> Option<T> {
        self(parts)
    }
}

/// Scopes by the value of a request header, for services whose gateway sets a trusted tenant
/// or principal header. A request without the header, or with an empty one, is refused
/// (`401`), unless [`allow_missing`](Self::allow_missing) was called; one with the header sent
/// twice is always refused (which of the two would be the gateway's?). Make the gateway
/// *replace* the header a client sent, never append to it.
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
    allow_missing: bool,
}

impl HeaderScope {
    /// Scopes by the header `name`; requests without it are refused.
    ///
    /// # Panics
    ///
    /// If `name` is not a valid header name.
    pub fn new(name: &str) -> Self {
        match http::HeaderName::try_from(name) {
            Ok(name) => Self {
                name,
                allow_missing: false,
            },
            Err(_) => panic!("HeaderScope::new: {name:?} is not a valid header name"),
        }
    }

    /// Lets requests without the header (or with an empty one) through, all in **one shared
    /// scope**: they can replay and block each other's keys, never those of a request that
    /// names a tenant. Only for services where anonymous requests are expected.
    ///
    /// ```
    /// use tower_once_idempotency::scope::{HeaderScope, Scope};
    ///
    /// let (parts, ()) = http::Request::post("/charges").body(()).unwrap().into_parts();
    /// assert!(HeaderScope::new("x-tenant-id").scope(&parts).is_none());
    /// assert!(HeaderScope::new("x-tenant-id").allow_missing().scope(&parts).is_some());
    /// ```
    pub fn allow_missing(mut self) -> Self {
        self.allow_missing = true;
        self
    }
}

impl Scope for HeaderScope {
    type Output = http::HeaderValue;

    fn scope(&self, parts: &Parts) -> Option<http::HeaderValue> {
        let mut values = parts.headers.get_all(&self.name).iter();
        match (values.next(), values.next()) {
            // NOTE: sent twice, the header is ambiguous (a gateway that appends its own value
            // after the client's, as Envoy does by default, would let a client pick the
            // first): refused, as a key header sent twice is, even with `allow_missing`.
            (Some(_), Some(_)) => None,
            // A clone shares the header's bytes. NOTE: an empty value is treated as missing,
            // so the shared scope of `allow_missing` (empty bytes) is never a tenant's own.
            (Some(value), None) if !value.is_empty() => Some(value.clone()),
            _ if self.allow_missing => Some(http::HeaderValue::from_static("")),
            _ => None,
        }
    }
}
