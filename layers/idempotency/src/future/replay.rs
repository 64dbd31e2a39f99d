//! Shaping answers: the layer's own problem responses, replays of stored responses, and the
//! headers kept when a response is stored.

use crate::body::ResponseBody;
use crate::config::IDEMPOTENT_REPLAYED;
use crate::metrics::Outcome;
use crate::problem::{ProblemKind, Problems};
use crate::store::{ExistingRecord, RecordState};
use http::header::HeaderValue;
use http::Response;
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
