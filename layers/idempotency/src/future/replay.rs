//! Shaping answers: the layer's own problem responses, replays of stored responses, and the
//! headers kept when a response is stored.

use crate::body::ResponseBody;
use crate::config::IDEMPOTENT_REPLAYED;
use crate::metrics::Outcome;
use crate::problem::{ProblemKind, Problems};
use crate::store::{ExistingRecord, RecordState};
use http::header::{self, HeaderValue};
use http::{HeaderMap, HeaderName, Response};
use http_body::Body;
use std::time::Duration;
use tracing::Span;

/// One of the layer's own answers (`application/problem+json`, or a gRPC status).
pub(crate) fn problem<B: Body>(
    problems: &Problems,
    grpc: bool,
    kind: ProblemKind,
    retry_after: Option<Duration>,
) -> Response<ResponseBody<B>> {
    problems
        .response(kind, retry_after, grpc)
        .map(ResponseBody::full)
}

/// The answer to a request whose key is held by an existing record.
pub(super) fn existing<B: Body>(
    span: &Span,
    problems: &Problems,
    grpc: bool,
    in_progress_retry_after: Duration,
    record: ExistingRecord,
    same_request: bool,
) -> Response<ResponseBody<B>> {
    if !same_request {
        Outcome::Mismatch.record(span);
        return problem(problems, grpc, ProblemKind::FingerprintMismatch, None);
    }
    match record.state {
        RecordState::InProgress { lease_remaining } => {
            Outcome::Conflict.record(span);
            let after = lease_remaining.min(in_progress_retry_after);
            problem(problems, grpc, ProblemKind::InProgress, Some(after))
        }
        RecordState::NotReplayable => {
            Outcome::Conflict.record(span);
            problem(problems, grpc, ProblemKind::NotReplayable, None)
        }
        RecordState::Completed(stored) => {
            Outcome::Replayed.record(span);
            let mut response = Response::new(ResponseBody::full_with_trailers(
                stored.body,
                stored.trailers,
            ));
            *response.status_mut() = stored.status;
            *response.headers_mut() = stored.headers;
            response
                .headers_mut()
                .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
            response
        }
    }
}

/// Hop-by-hop headers (RFC 9110 §7.6.1) describe one connection, never a stored response.
///
/// NOTE: `Trailer` is not among them: it announces the fields sent in the trailers, which a
/// replay sends too (HTTP/1.1 sends trailers only for fields it names).
const HOP_BY_HOP: [HeaderName; 7] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRANSFER_ENCODING,
];

/// The headers to store: all but hop-by-hop ones, those the `Connection` header names, `Upgrade`
/// and the configured deny-list.
pub(crate) fn storable_headers(headers: &HeaderMap, strip: &[HeaderName]) -> HeaderMap {
    // One lookup of `Connection`, not one per header.
    let connection = headers.get_all(header::CONNECTION);
    let named_by_connection = |name: &HeaderName| {
        connection.iter().any(|v| {
            v.to_str().is_ok_and(|v| {
                v.split(',')
                    .any(|token| token.trim().eq_ignore_ascii_case(name.as_str()))
            })
        })
    };
    let dropped = |name: &HeaderName| {
        HOP_BY_HOP.contains(name)
            || name == header::UPGRADE
            || strip.contains(name)
            || named_by_connection(name)
    };
    // Usually nothing is dropped: a clone copies the map without hashing each name again.
    if !headers.keys().any(dropped) {
        return headers.clone();
    }
    let mut kept = HeaderMap::with_capacity(headers.len());
    for (name, value) in headers {
        if !dropped(name) {
            kept.append(name.clone(), value.clone());
        }
    }
    kept
}
