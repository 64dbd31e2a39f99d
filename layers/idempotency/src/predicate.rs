//! Which responses are stored for replay, and which release the key so a retry runs again.
//!
//! | response                                   | default decision |
//! |--------------------------------------------|------------------|
//! | 2xx, 3xx                                   | store            |
//! | 4xx except those below                     | store            |
//! | 400 Bad Request, 413 Content Too Large, 415 Unsupported Media Type, 422 Unprocessable Content | release (validation) |
//! | 408 Request Timeout, 425 Too Early, 429 Too Many Requests | release |
//! | 5xx                                        | release          |
//! | inner service error                        | release (always) |
//!
//! So the default stores every response but 5xx and 400, 408, 413, 415, 422, 425, 429
//! ([`RELEASED_CLIENT_ERRORS`]).
//!
//! gRPC answers HTTP `200` and puts its status in `grpc-status`, in the headers of a
//! trailers-only response or in the trailers. The default reads it in both places and maps it the
//! same way: final codes are stored (`OK`, `INVALID_ARGUMENT`, `NOT_FOUND`, `ALREADY_EXISTS`,
//! `PERMISSION_DENIED`, `FAILED_PRECONDITION`, `OUT_OF_RANGE`, `UNIMPLEMENTED`,
//! `UNAUTHENTICATED`); transient ones release the key (`CANCELLED`, `UNKNOWN`,
//! `DEADLINE_EXCEEDED`, `RESOURCE_EXHAUSTED`, `ABORTED`, `INTERNAL`, `UNAVAILABLE`,
//! `DATA_LOSS`, and any unknown code).
//!
//! A stored 4xx means "this request is wrong": retrying it unchanged cannot succeed, and replaying
//! the same answer is what the IETF draft and Stripe do. 400, 413, 415 and 422 are the
//! rejections a framework makes before the handler does anything (axum answers 415 for a
//! missing `Content-Type`, 422 for JSON that does not match, 400 for a bad query, 413 past its
//! `DefaultBodyLimit`): the client is
//! expected to fix its request and resend it with the same key, and Stripe saves no result when
//! a request fails validation, so they release the key. The layer's own `422` (a key reused with
//! another request) is told apart by its problem `type`,
//! `urn:tower-once:idempotency:fingerprint-mismatch`. 408, 425 and 429 say "not now", so the
//! client's retry should run. Replace the rule with
//! [`IdempotencyLayer::store_when`](crate::IdempotencyLayer::store_when); any
//! `Fn(&http::response::Parts) -> bool` is a [`StorePredicate`].

use http::response::Parts;
use http::{HeaderMap, StatusCode};
use tower_once_core::grpc::Code;

/// Decides whether a response is stored (`true`) or its key released (`false`).
///
/// ```
/// use tower_once_idempotency::predicate::{DefaultPredicate, StorePredicate};
///
/// let parts = |status: u16| {
///     let mut res = http::Response::new(());
///     *res.status_mut() = http::StatusCode::from_u16(status).unwrap();
///     res.into_parts().0
/// };
/// assert!(DefaultPredicate.should_store(&parts(201)));
/// assert!(DefaultPredicate.should_store(&parts(404)));
/// assert!(!DefaultPredicate.should_store(&parts(422)), "validation: the client resends");
/// assert!(!DefaultPredicate.should_store(&parts(429)));
/// assert!(!DefaultPredicate.should_store(&parts(503)));
///
/// // Store only successes: every 4xx releases the key too.
/// let only_success = |parts: &http::response::Parts| parts.status.is_success();
/// assert!(!only_success.should_store(&parts(404)));
/// ```
pub trait StorePredicate {
    /// Whether the response with these parts is stored for replay.
    fn should_store(&self, parts: &Parts) -> bool;

    /// Asked once the body has ended with `trailers`, for a response
    /// [`should_store`](Self::should_store) accepted: whether it is still stored. The default
    /// keeps it; [`DefaultPredicate`] reads gRPC's `grpc-status` here.
    fn should_store_trailers(&self, trailers: &HeaderMap) -> bool {
        let _ = trailers;
        true
    }
}

impl<F> StorePredicate for F
where
    F: Fn(&Parts) -> bool,
{
    fn should_store(&self, parts: &Parts) -> bool {
        self(parts)
    }
}

/// The default rule: see the [module docs](self).
#[derive(Debug, Clone, Copy, Default)]
pub struct DefaultPredicate;

/// The client errors that [`DefaultPredicate`] releases instead of storing: the validation
/// rejections (400, 413, 415, 422) and "not now" (408, 425, 429). It stores every other 4xx,
/// every 2xx and 3xx, and releases every 5xx. The one list the docs quote.
///
/// ```
/// use tower_once_idempotency::predicate::{DefaultPredicate, StorePredicate, RELEASED_CLIENT_ERRORS};
///
/// for code in 100..600u16 {
///     let mut res = http::Response::new(());
///     *res.status_mut() = http::StatusCode::from_u16(code).unwrap();
///     let status = res.status();
///     let released = status.is_server_error() || RELEASED_CLIENT_ERRORS.contains(&status);
///     assert_eq!(DefaultPredicate.should_store(&res.into_parts().0), !released, "{code}");
/// }
/// ```
pub const RELEASED_CLIENT_ERRORS: [StatusCode; 7] = [
    StatusCode::BAD_REQUEST,
    StatusCode::REQUEST_TIMEOUT,
    StatusCode::PAYLOAD_TOO_LARGE,
    StatusCode::UNSUPPORTED_MEDIA_TYPE,
    StatusCode::UNPROCESSABLE_ENTITY,
    StatusCode::TOO_EARLY,
    StatusCode::TOO_MANY_REQUESTS,
];

impl StorePredicate for DefaultPredicate {
    fn should_store(&self, parts: &Parts) -> bool {
        let status = parts.status;
        let http_final = !(status.is_server_error() || RELEASED_CLIENT_ERRORS.contains(&status));
        http_final && self.should_store_trailers(&parts.headers)
    }

    fn should_store_trailers(&self, trailers: &HeaderMap) -> bool {
        if !Code::is_present(trailers) {
            return true;
        }
        matches!(
            Code::of(trailers),
            Some(
                Code::Ok
                    | Code::InvalidArgument
                    | Code::NotFound
                    | Code::AlreadyExists
                    | Code::PermissionDenied
                    | Code::FailedPrecondition
                    | Code::OutOfRange
                    | Code::Unimplemented
                    | Code::Unauthenticated
            )
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The docs quote [`RELEASED_CLIENT_ERRORS`] as it is.
    #[test]
    fn every_doc_quotes_the_released_statuses_as_the_code_has_them() {
        let list = RELEASED_CLIENT_ERRORS
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join(", ");
        assert_eq!(list, "400, 408, 413, 415, 422, 425, 429");
        for (name, text) in [
            ("lib.rs", include_str!("lib.rs")),
            ("layer.rs", include_str!("layer.rs")),
            ("predicate.rs", include_str!("predicate.rs")),
        ] {
            assert!(text.contains(&list), "{name} does not quote {list}");
        }
    }

    #[test]
    fn grpc_codes_in_headers_and_trailers() {
        let with = |code: &'static str| {
            let mut res = http::Response::new(());
            res.headers_mut()
                .insert("grpc-status", http::HeaderValue::from_static(code));
            res.into_parts().0
        };
        for code in ["0", "3", "5", "6", "7", "9", "11", "12", "16"] {
            assert!(
                DefaultPredicate.should_store(&with(code)),
                "{code} is final: store"
            );
            assert!(DefaultPredicate.should_store_trailers(&with(code).headers));
        }
        for code in ["1", "2", "4", "8", "10", "13", "14", "15", "99", "x"] {
            assert!(
                !DefaultPredicate.should_store(&with(code)),
                "{code} is transient: release"
            );
            assert!(!DefaultPredicate.should_store_trailers(&with(code).headers));
        }
        assert!(DefaultPredicate.should_store_trailers(&HeaderMap::new()));
        let closure = |_: &Parts| true;
        assert!(
            closure.should_store_trailers(&with("14").headers),
            "closures keep the default"
        );
    }
}
