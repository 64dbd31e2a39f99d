//! gRPC statuses as the layers see them.

use http::header::CONTENT_TYPE;
use http::{HeaderMap, HeaderValue, Response};

/// The trailers of a gRPC response, as a response extension: put there by a layer that read
/// the body (`tower_once_retry::grpc::GrpcTrailersLayer`), so that classifiers see a status
/// that arrived in the trailers.
#[derive(Debug, Clone)]
pub struct Trailers(pub HeaderMap);

/// Whether a request or response speaks gRPC (`content-type: application/grpc`, with or
/// without a `+proto`-style suffix).
///
/// ```
/// let mut headers = http::HeaderMap::new();
/// headers.insert("content-type", "application/grpc+proto".parse().unwrap());
/// assert!(tower_once_core::grpc::is_grpc(&headers));
/// ```
pub fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

/// A gRPC status code (the `grpc-status` header or trailer).
///
/// ```
/// use tower_once_core::grpc::Code;
///
/// let mut trailers = http::HeaderMap::new();
/// trailers.insert("grpc-status", "14".parse().unwrap());
/// assert_eq!(Code::of(&trailers), Some(Code::Unavailable));
/// assert_eq!(Code::Unavailable.as_str(), "14");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Code {
    /// 0
    Ok,
    /// 1
    Cancelled,
    /// 2
    Unknown,
    /// 3
    InvalidArgument,
    /// 4
    DeadlineExceeded,
    /// 5
    NotFound,
    /// 6
    AlreadyExists,
    /// 7
    PermissionDenied,
    /// 8
    ResourceExhausted,
    /// 9
    FailedPrecondition,
    /// 10
    Aborted,
    /// 11
    OutOfRange,
    /// 12
    Unimplemented,
    /// 13
    Internal,
    /// 14
    Unavailable,
    /// 15
    DataLoss,
    /// 16
    Unauthenticated,
}

const CODES: [Code; 17] = [
    Code::Ok,
    Code::Cancelled,
    Code::Unknown,
    Code::InvalidArgument,
    Code::DeadlineExceeded,
    Code::NotFound,
    Code::AlreadyExists,
    Code::PermissionDenied,
    Code::ResourceExhausted,
    Code::FailedPrecondition,
    Code::Aborted,
    Code::OutOfRange,
    Code::Unimplemented,
    Code::Internal,
    Code::Unavailable,
    Code::DataLoss,
    Code::Unauthenticated,
];

const STRINGS: [&str; 17] = [
    "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12", "13", "14", "15", "16",
];

impl Code {
    /// The header holding the status.
    pub const HEADER: &'static str = "grpc-status";

    /// The code of a `grpc-status` value; `None` for anything but `0`..=`16`.
    pub fn from_bytes(value: &[u8]) -> Option<Self> {
        let index = STRINGS.iter().position(|s| s.as_bytes() == value)?;
        Some(CODES[index])
    }

    /// The status in `headers` (the headers of a trailers-only response, or trailers):
    /// `None` when absent or not a known code.
    pub fn of(headers: &HeaderMap) -> Option<Self> {
        Self::from_bytes(headers.get(Self::HEADER)?.as_bytes())
    }

    /// Whether `headers` carry a `grpc-status` at all, known or not.
    pub fn is_present(headers: &HeaderMap) -> bool {
        headers.contains_key(Self::HEADER)
    }

    /// The number, as sent on the wire.
    pub const fn as_str(self) -> &'static str {
        STRINGS[self as usize]
    }

    /// A trailers-only answer: HTTP `200`, `content-type: application/grpc`, this status and
    /// `message` as `grpc-message` (it must already be percent-encoded where gRPC asks).
    pub fn trailers_only(self, message: &'static str) -> Response<()> {
        let mut response = Response::new(());
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        headers.insert(Self::HEADER, HeaderValue::from_static(self.as_str()));
        headers.insert("grpc-message", HeaderValue::from_static(message));
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_strangers_are_none() {
        for (n, code) in CODES.iter().enumerate() {
            assert_eq!(code.as_str(), n.to_string());
            assert_eq!(Code::from_bytes(n.to_string().as_bytes()), Some(*code));
        }
        for junk in ["17", "-1", "", "01", "x", "14 "] {
            assert_eq!(Code::from_bytes(junk.as_bytes()), None, "{junk:?}");
        }
        let response = Code::DeadlineExceeded.trailers_only("Deadline%20Exceeded");
        assert!(is_grpc(response.headers()));
        assert_eq!(Code::of(response.headers()), Some(Code::DeadlineExceeded));
    }
}
