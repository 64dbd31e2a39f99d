//! The layer's own error responses: RFC 9457 `application/problem+json`, one stable `type` per
//! case.
//!
//! | case                          | status | `type`                                              | `Retry-After` |
//! |-------------------------------|--------|-----------------------------------------------------|---------------|
//! | key required but missing      | 400    | `urn:tower-once:idempotency:missing-key`            |               |
//! | key malformed                 | 400    | `urn:tower-once:idempotency:invalid-key`            |               |
//! | no tenant or principal to scope the key by ([`scope`](crate::scope)) | 401 | `urn:tower-once:idempotency:missing-scope` | |
//! | request body unreadable       | 400    | `urn:tower-once:idempotency:request-body-error`     |               |
//! | request body over the limit   | 413    | `urn:tower-once:idempotency:body-too-large`         |               |
//! | same key still in progress    | 409    | `urn:tower-once:idempotency:in-progress`            | min(lease left, 1 s), with `Idempotency-In-Progress: true` |
//! | same key, completed, response too large to keep | 409 | `urn:tower-once:idempotency:not-replayable` |      |
//! | same key, different request   | 422    | `urn:tower-once:idempotency:fingerprint-mismatch`   |               |
//! | handler's response body failed | 500  | `urn:tower-once:idempotency:response-body-error`    |               |
//! | store unreachable or full     | 503    | `urn:tower-once:idempotency:store-unavailable`      | configured    |
//!
//! Clients should branch on `type`, not on `title` or `detail`.
//!
//! gRPC requests (`content-type: application/grpc...`) get gRPC statuses instead, in a
//! trailers-only response ([`ProblemKind::grpc_response`]): `INVALID_ARGUMENT` for a missing or
//! malformed key or an unreadable body, `UNAUTHENTICATED` for a missing scope, `RESOURCE_EXHAUSTED` for a body over the limit,
//! `UNAVAILABLE` with `grpc-retry-pushback-ms` for "in progress" and "store unavailable",
//! `FAILED_PRECONDITION` for a reused key or a response not kept, `INTERNAL` for a failed
//! response body.

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use http::{Response, StatusCode};
use std::time::Duration;
/// gRPC status codes, as the layer answers gRPC clients with them.
pub use tower_once_core::grpc::Code;
use tower_once_core::IDEMPOTENCY_IN_PROGRESS;

/// One case of layer-generated error response.
///
/// ```
/// use tower_once_idempotency::problem::ProblemKind;
///
/// assert_eq!(ProblemKind::InProgress.status(), 409);
/// assert_eq!(ProblemKind::InProgress.type_uri(), "urn:tower-once:idempotency:in-progress");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ProblemKind {
    /// The layer requires a key and the request has none.
    MissingKey,
    /// The key header is malformed (see [`key`](crate::key)).
    InvalidKey,
    /// The request has no scope (no tenant or principal) to keep its key apart from other
    /// tenants' keys: see [`scope`](crate::scope).
    MissingScope,
    /// The request body could not be read.
    RequestBodyError,
    /// The request body is larger than the configured limit.
    BodyTooLarge,
    /// A request with the same key is still being processed.
    InProgress,
    /// A request with the same key completed, but its response was too large to store.
    NotReplayable,
    /// The key was used before with a different request.
    FingerprintMismatch,
    /// The handler's response body failed while the layer was reading it.
    ResponseBodyError,
    /// The idempotency store could not be reached (or is full).
    StoreUnavailable,
}

impl ProblemKind {
    /// The HTTP status this case answers with.
    pub const fn status(self) -> StatusCode {
        match self {
            Self::MissingKey | Self::InvalidKey | Self::RequestBodyError => StatusCode::BAD_REQUEST,
            Self::MissingScope => StatusCode::UNAUTHORIZED,
            Self::BodyTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Self::InProgress | Self::NotReplayable => StatusCode::CONFLICT,
            Self::FingerprintMismatch => StatusCode::UNPROCESSABLE_ENTITY,
            Self::ResponseBodyError => StatusCode::INTERNAL_SERVER_ERROR,
            Self::StoreUnavailable => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// The stable problem `type` URI.
    pub const fn type_uri(self) -> &'static str {
        self.strings().0
    }

    /// The short human-readable title.
    pub const fn title(self) -> &'static str {
        self.strings().1
    }

    const fn strings(self) -> (&'static str, &'static str, &'static str) {
        match self {
            Self::MissingKey => (
                "urn:tower-once:idempotency:missing-key",
                "Idempotency-Key required",
                "This endpoint requires an Idempotency-Key header.",
            ),
            Self::InvalidKey => (
                "urn:tower-once:idempotency:invalid-key",
                "Invalid Idempotency-Key",
                "The Idempotency-Key must be 1 to 255 visible ASCII characters, bare or as a quoted string, sent once.",
            ),
            Self::MissingScope => (
                "urn:tower-once:idempotency:missing-scope",
                "Request scope missing",
                "The request names no tenant or principal, so its Idempotency-Key cannot be kept apart from other clients' keys. It was not processed.",
            ),
            Self::RequestBodyError => (
                "urn:tower-once:idempotency:request-body-error",
                "Request body unreadable",
                "The request body could not be read completely.",
            ),
            Self::BodyTooLarge => (
                "urn:tower-once:idempotency:body-too-large",
                "Request body too large",
                "The request body is larger than this endpoint accepts for idempotent requests.",
            ),
            Self::InProgress => (
                "urn:tower-once:idempotency:in-progress",
                "Request in progress",
                "A request with this Idempotency-Key is still being processed. Retry after the time in Retry-After.",
            ),
            Self::NotReplayable => (
                "urn:tower-once:idempotency:not-replayable",
                "Response not replayable",
                "A request with this Idempotency-Key completed, but its response was too large to keep. It will not run again.",
            ),
            Self::FingerprintMismatch => (
                "urn:tower-once:idempotency:fingerprint-mismatch",
                "Idempotency-Key reused",
                "This Idempotency-Key was used with a different request. Use a new key for a new request.",
            ),
            Self::ResponseBodyError => (
                "urn:tower-once:idempotency:response-body-error",
                "Response failed",
                "The response could not be produced completely; the request may be retried with the same key.",
            ),
            Self::StoreUnavailable => (
                "urn:tower-once:idempotency:store-unavailable",
                "Idempotency store unavailable",
                "The request was not processed because its Idempotency-Key could not be checked. Retry later.",
            ),
        }
    }

    /// The gRPC status code this case answers gRPC clients with.
    ///
    /// ```
    /// use tower_once_idempotency::problem::{Code, ProblemKind};
    ///
    /// assert_eq!(ProblemKind::InProgress.grpc_code(), Code::Unavailable); // with a pushback
    /// assert_eq!(ProblemKind::FingerprintMismatch.grpc_code(), Code::FailedPrecondition);
    /// ```
    pub const fn grpc_code(self) -> Code {
        match self {
            Self::MissingKey | Self::InvalidKey | Self::RequestBodyError => Code::InvalidArgument,
            Self::MissingScope => Code::Unauthenticated,
            Self::BodyTooLarge => Code::ResourceExhausted,
            Self::NotReplayable | Self::FingerprintMismatch => Code::FailedPrecondition,
            Self::ResponseBodyError => Code::Internal,
            Self::InProgress | Self::StoreUnavailable => Code::Unavailable,
        }
    }

    /// The trailers-only gRPC response for this case: HTTP `200`, `content-type:
    /// application/grpc`, `grpc-status`, `grpc-message` (the title), and
    /// `grpc-retry-pushback-ms` when `retry_after` is given (gRPC's `Retry-After`).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_once_idempotency::problem::ProblemKind;
    ///
    /// let res = ProblemKind::InProgress.grpc_response(Some(Duration::from_millis(1500)));
    /// assert_eq!(res.status(), 200);
    /// assert_eq!(res.headers()["grpc-status"], "14");
    /// assert_eq!(res.headers()["grpc-retry-pushback-ms"], "1500");
    /// ```
    pub fn grpc_response(self, retry_after: Option<Duration>) -> Response<Bytes> {
        // Titles are printable ASCII without '%': valid percent-encoded grpc-messages as they are.
        let mut response = self
            .grpc_code()
            .trailers_only(self.title())
            .map(|()| Bytes::new());
        let headers = response.headers_mut();
        if let Some(after) = retry_after {
            let ms = u64::try_from(after.as_millis()).unwrap_or(u64::MAX);
            headers.insert("grpc-retry-pushback-ms", HeaderValue::from(ms));
        }
        response
    }

    /// The complete `application/problem+json` body.
    pub fn body(self) -> Bytes {
        let (type_uri, title, detail) = self.strings();
        // Every string is a constant above without characters that need JSON escaping.
        Bytes::from(format!(
            r#"{{"type":"{type_uri}","title":"{title}","status":{},"detail":"{detail}"}}"#,
            self.status().as_u16()
        ))
    }

    /// The response for this case, with `Retry-After` (whole seconds, rounded up, at least 1)
    /// when `retry_after` is given.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_once_idempotency::problem::ProblemKind;
    ///
    /// let res = ProblemKind::InProgress.response(Some(Duration::from_millis(1500)));
    /// assert_eq!(res.status(), 409);
    /// assert_eq!(res.headers()["retry-after"], "2");
    /// assert_eq!(res.headers()["content-type"], "application/problem+json");
    /// ```
    pub fn response(self, retry_after: Option<Duration>) -> Response<Bytes> {
        let mut response = Response::new(self.body());
        *response.status_mut() = self.status();
        let headers = response.headers_mut();
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if let Some(after) = retry_after {
            headers.insert(RETRY_AFTER, retry_after_value(after));
        }
        response
    }
}

/// A user-supplied builder of the layer's error responses; see
/// [`IdempotencyLayer::problem_response`](crate::IdempotencyLayer::problem_response).
pub(crate) type ProblemFn =
    dyn Fn(ProblemKind, Option<Duration>) -> Response<Bytes> + Send + Sync + 'static;

/// How the layer builds its error responses: [`ProblemKind::response`] or the user's function.
#[derive(Clone, Default)]
pub(crate) struct Problems(Option<std::sync::Arc<ProblemFn>>);

impl Problems {
    pub(crate) fn custom(f: std::sync::Arc<ProblemFn>) -> Self {
        Self(Some(f))
    }

    pub(crate) fn response(
        &self,
        kind: ProblemKind,
        retry_after: Option<Duration>,
        grpc: bool,
    ) -> Response<Bytes> {
        let mut response = match &self.0 {
            Some(custom) => custom(kind, retry_after),
            None if grpc => kind.grpc_response(retry_after),
            None => kind.response(retry_after),
        };
        // NOTE: what tells a client's retry layer "still running, not a failure" (its
        // classifier's `InProgress`), in every format, custom ones included.
        if kind == ProblemKind::InProgress {
            response
                .headers_mut()
                .insert(IDEMPOTENCY_IN_PROGRESS, HeaderValue::from_static("true"));
        }
        response
    }
}

impl std::fmt::Debug for Problems {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "custom"
        } else {
            "application/problem+json"
        })
    }
}

/// `Retry-After` delta-seconds for `after`, rounded up, at least 1.
pub(crate) fn retry_after_value(after: Duration) -> HeaderValue {
    let secs = after.as_secs() + u64::from(after.subsec_nanos() > 0);
    HeaderValue::from(secs.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [ProblemKind; 10] = [
        ProblemKind::MissingKey,
        ProblemKind::InvalidKey,
        ProblemKind::MissingScope,
        ProblemKind::RequestBodyError,
        ProblemKind::BodyTooLarge,
        ProblemKind::InProgress,
        ProblemKind::NotReplayable,
        ProblemKind::FingerprintMismatch,
        ProblemKind::ResponseBodyError,
        ProblemKind::StoreUnavailable,
    ];

    #[test]
    fn bodies_are_json_objects_with_the_rfc9457_members() {
        for kind in ALL {
            let body: serde_json::Value = serde_json::from_slice(&kind.body()).unwrap();
            assert_eq!(body["type"], kind.type_uri());
            assert_eq!(body["title"], kind.title());
            assert_eq!(body["status"], kind.status().as_u16());
            assert!(body["detail"].as_str().is_some_and(|d| d.len() > 20));
            assert_eq!(body.as_object().map(|o| o.len()), Some(4));
        }
    }

    #[test]
    fn retry_after_rounds_up() {
        assert_eq!(retry_after_value(Duration::ZERO), "1");
        assert_eq!(retry_after_value(Duration::from_secs(3)), "3");
        assert_eq!(retry_after_value(Duration::from_millis(3001)), "4");
    }
}
