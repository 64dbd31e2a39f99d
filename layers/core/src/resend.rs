//! Whether an HTTP request may be sent more than once, and the key that makes a `POST` so:
//! the one rule the retry layer, the fallback and the hedging layer apply.
//!
//! | request | may be sent again |
//! |---|---|
//! | an idempotent method: `GET`, `HEAD`, `OPTIONS`, `PUT`, `DELETE`, `TRACE` | yes |
//! | any method, with an `Idempotency-Key` (the server runs it once per key) | yes |
//! | any method, marked [`SafeToRetry`] (no effect, or an idempotent one: an LLM completion, a search) | yes |
//! | `POST`, `PATCH` (or another method) without them | no; [`stamp_idempotency_key`] gives it a key |
//!
//! ```
//! use tower_once_core::resend::{may_resend, stamp_idempotency_key, SafeToRetry};
//!
//! let mut charge = http::Request::post("https://api.example/charges").body(()).unwrap();
//! assert!(!may_resend(&charge));
//! assert!(stamp_idempotency_key(&mut charge));
//! assert!(may_resend(&charge), "the same key on every copy: the server runs it once");
//!
//! let mut completion = http::Request::post("https://llm.example/v1/messages").body(()).unwrap();
//! completion.extensions_mut().insert(SafeToRetry);
//! assert!(may_resend(&completion));
//! assert!(!stamp_idempotency_key(&mut completion), "it needs no key");
//! ```

use crate::IDEMPOTENCY_KEY;
use http::{HeaderValue, Method, Request};

/// A request extension that says "this request may be sent more than once": its effect is
/// idempotent, or it has none (an LLM completion, a search). The retry layer then retries a
/// `POST` without an `Idempotency-Key` (and sends none: some providers ignore or refuse the
/// header), the fallback sends it to its secondary, and the hedging layer hedges it.
///
/// ```
/// use tower_once_core::resend::SafeToRetry;
///
/// let mut completion = http::Request::post("https://llm.example/v1/messages").body(()).unwrap();
/// completion.extensions_mut().insert(SafeToRetry);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SafeToRetry;

/// Whether `method` is idempotent (RFC 9110 §9.2.2): sending it twice has the effect of once.
pub fn is_idempotent(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::PUT | Method::DELETE | Method::TRACE
    )
}

/// Whether `req` may be sent more than once. See the [module docs](self).
pub fn may_resend<B>(req: &Request<B>) -> bool {
    may_resend_parts(req.method(), req.headers(), req.extensions())
}

/// [`may_resend`] over a request's parts.
pub(crate) fn may_resend_parts(
    method: &Method,
    headers: &http::HeaderMap,
    extensions: &http::Extensions,
) -> bool {
    is_idempotent(method)
        || headers.contains_key(IDEMPOTENCY_KEY)
        || extensions.get::<SafeToRetry>().is_some()
}

/// Gives an unkeyed `POST` or `PATCH` (not marked [`SafeToRetry`]) a fresh `Idempotency-Key`,
/// a UUID v4, so that every copy of it carries the same key. Returns whether it stamped one.
pub fn stamp_idempotency_key<B>(req: &mut Request<B>) -> bool {
    let stampable = matches!(*req.method(), Method::POST | Method::PATCH)
        && req.extensions().get::<SafeToRetry>().is_none()
        && !req.headers().contains_key(IDEMPOTENCY_KEY);
    if !stampable {
        return false;
    }
    let key = uuid::Uuid::new_v4().hyphenated().to_string();
    match HeaderValue::from_str(&key) {
        Ok(value) => {
            req.headers_mut().insert(IDEMPOTENCY_KEY, value);
            true
        }
        Err(_) => false,
    }
}
