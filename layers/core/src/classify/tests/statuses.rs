//! The module docs' table: which HTTP statuses and gRPC codes (in headers or in trailers read
//! by the body) are a success, a retry (after `Retry-After` or `grpc-retry-pushback-ms` when
//! sent), "in progress", or a stop.

use super::super::{Action, Classify, HttpClassifier};
use super::headers;
use http::{HeaderMap, Response, StatusCode};
use std::time::Duration;

fn classify(status: u16, pairs: &[(&'static str, &str)]) -> Action {
    let mut res = Response::new(());
    *res.status_mut() = StatusCode::from_u16(status).unwrap();
    *res.headers_mut() = headers(pairs);
    HttpClassifier.classify(&Ok::<_, ()>(res))
}

#[test]
fn http_statuses() {
    for s in [408, 429, 500, 502, 503, 504] {
        assert_eq!(classify(s, &[]), Action::Retry { after: None }, "{s}");
    }
    for s in [200, 201, 204, 301, 304] {
        assert_eq!(classify(s, &[]), Action::Success, "{s}");
    }
    for s in [400, 401, 403, 404, 409, 410, 422, 501, 505] {
        assert_eq!(classify(s, &[]), Action::Stop, "{s}");
    }
    let after = Some(Duration::from_secs(3));
    assert_eq!(
        classify(409, &[("retry-after", "3")]),
        Action::InProgress { after }
    );
    assert_eq!(
        classify(409, &[("idempotency-in-progress", "true")]),
        Action::InProgress { after: None }
    );
    assert_eq!(
        classify(503, &[("retry-after", "3")]),
        Action::Retry { after }
    );
    assert_eq!(
        classify(503, &[("retry-after", "soon")]),
        Action::Retry { after: None }
    );
    assert_eq!(
        HttpClassifier.classify(&Err::<Response<()>, _>("reset")),
        Action::Retry { after: None }
    );
}

#[test]
fn grpc_status_in_read_trailers() {
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", "14".parse().unwrap());
    trailers.insert("grpc-retry-pushback-ms", "40".parse().unwrap());
    let mut res = Response::new(());
    res.extensions_mut().insert(crate::grpc::Trailers(trailers));
    let after = Some(Duration::from_millis(40));
    assert_eq!(
        HttpClassifier.classify(&Ok::<_, ()>(res)),
        Action::Retry { after }
    );
}

#[test]
fn grpc_statuses_and_pushback() {
    assert_eq!(classify(200, &[("grpc-status", "0")]), Action::Success);
    assert_eq!(
        classify(200, &[("grpc-status", "14")]),
        Action::Retry { after: None }
    );
    assert_eq!(
        classify(200, &[("grpc-status", "8")]),
        Action::Retry { after: None }
    );
    assert_eq!(
        classify(200, &[("grpc-status", "3")]),
        Action::Stop,
        "INVALID_ARGUMENT"
    );
    assert_eq!(
        classify(200, &[("grpc-status", "4")]),
        Action::Stop,
        "DEADLINE_EXCEEDED"
    );
    let in_progress = classify(
        200,
        &[
            ("grpc-status", "14"),
            ("grpc-retry-pushback-ms", "700"),
            ("idempotency-in-progress", "true"),
        ],
    );
    assert_eq!(
        in_progress,
        Action::InProgress {
            after: Some(Duration::from_millis(700))
        }
    );
    let pushback = |v| classify(200, &[("grpc-status", "14"), ("grpc-retry-pushback-ms", v)]);
    assert_eq!(
        pushback("250"),
        Action::Retry {
            after: Some(Duration::from_millis(250))
        }
    );
    assert_eq!(
        pushback("-1"),
        Action::Stop,
        "negative pushback: do not retry"
    );
    assert_eq!(pushback("abc"), Action::Stop);
}

#[test]
fn llm_provider_conventions() {
    // 529: the provider is overloaded (Anthropic's API), a retry like 503.
    assert_eq!(classify(529, &[]), Action::Retry { after: None });
    // `retry-after-ms` (milliseconds, fractions allowed) is preferred over `Retry-After`.
    assert_eq!(
        classify(429, &[("retry-after-ms", "1500"), ("retry-after", "9")]),
        Action::Retry {
            after: Some(Duration::from_millis(1500))
        }
    );
    assert_eq!(
        classify(529, &[("retry-after-ms", "250.5")]),
        Action::Retry {
            after: Some(Duration::from_micros(250_500))
        }
    );
    // A malformed or negative one falls back to `Retry-After`, then to the backoff.
    assert_eq!(
        classify(503, &[("retry-after-ms", "-5"), ("retry-after", "2")]),
        Action::Retry {
            after: Some(Duration::from_secs(2))
        }
    );
    assert_eq!(
        classify(503, &[("retry-after-ms", "soon")]),
        Action::Retry { after: None }
    );
    // `x-should-retry` overrides the status for failures, never for successes.
    assert_eq!(classify(500, &[("x-should-retry", "false")]), Action::Stop);
    assert_eq!(
        classify(400, &[("x-should-retry", "true")]),
        Action::Retry { after: None }
    );
    assert_eq!(
        classify(409, &[("x-should-retry", "true"), ("retry-after-ms", "20")]),
        Action::Retry {
            after: Some(Duration::from_millis(20))
        }
    );
    assert_eq!(
        classify(200, &[("x-should-retry", "true")]),
        Action::Success
    );
    assert_eq!(
        classify(503, &[("x-should-retry", "maybe")]),
        Action::Retry { after: None }
    );
}
