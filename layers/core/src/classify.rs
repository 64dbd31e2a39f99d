//! Deciding what an outcome means: done, worth another attempt (perhaps after a delay the server
//! asked for), or final. One vocabulary for every layer: the retry layer retries what is
//! [`Retry`](Action::Retry), the circuit breaker counts it as a failure of the dependency, the
//! fallback sends it to the secondary, the hedging layer keeps waiting for another attempt, and
//! the worker leaves the job for redelivery; a [`Stop`](Action::Stop) is the caller's own fault
//! (a `400`, a `404`, a `422`) and none of them acts on it.
//!
//! A classifier returns an [`Action`], not a bool, so a server's `Retry-After` or gRPC's
//! `grpc-retry-pushback-ms` travels with the decision. Any `Fn(&Result<Res, E>) -> Action` is a
//! [`Classify`].
//!
//! [`HttpClassifier`], for `http::Response` outcomes:
//!
//! | outcome | action |
//! |---|---|
//! | `Err(_)` (transport, connect, a `TimeoutLayer`'s `Elapsed`) | retry |
//! | `x-should-retry: false` on a non-2xx/3xx answer (the LLM providers' convention) | stop |
//! | `x-should-retry: true` on a non-2xx/3xx answer | retry, after the server's delay if sent |
//! | 408, 429, 500, 502, 503, 504, 529 (provider overloaded) | retry, after the server's delay if sent: `retry-after-ms` (milliseconds), else `Retry-After` |
//! | 409 with `Retry-After` or `Idempotency-In-Progress: true` (an idempotency server: "still in progress") | in progress: ask again after it |
//! | `grpc-status` 14 `UNAVAILABLE` with `idempotency-in-progress: true` | in progress: ask again after `grpc-retry-pushback-ms` |
//! | `grpc-status` 14 `UNAVAILABLE` or 8 `RESOURCE_EXHAUSTED` | retry, after `grpc-retry-pushback-ms` if sent; a negative or malformed pushback stops |
//! | anything else (2xx, 3xx, other 4xx and 5xx, other gRPC codes) | success or stop: returned as is |
//!
//! Defaults compose: a closure can delegate to them and override one case.
//!
//! ```
//! use tower_once_core::classify::{Action, Classify, HttpClassifier};
//!
//! // A CDN that briefly answers 404 for fresh objects: retry those too, otherwise as usual.
//! let cdn = |outcome: &Result<http::Response<()>, std::io::Error>| match outcome {
//!     Ok(r) if r.status() == http::StatusCode::NOT_FOUND => Action::Retry { after: None },
//!     other => HttpClassifier.classify(other),
//! };
//! let not_found = http::Response::builder().status(404).body(()).unwrap();
//! assert_eq!(cdn.classify(&Ok(not_found)), Action::Retry { after: None });
//! ```
//!
//! gRPC status is read from the response headers (trailers-only responses, which is how tonic
//! and grpc-go answer failed unary calls) or, when a
//! `GrpcTrailersLayer` (of `tower_once_retry::grpc`) below read them ([`Trailers`]), from the trailers.

use crate::grpc::{Code, Trailers};
use crate::IDEMPOTENCY_IN_PROGRESS;
use http::{HeaderMap, Response, StatusCode};
use std::time::{Duration, SystemTime};

/// What to do with an outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Action {
    /// Done: return it.
    Success,
    /// Transient: try again, after `after` if the server said how long to wait.
    Retry {
        /// The server's requested delay (`Retry-After`, gRPC pushback); `None` uses the backoff.
        after: Option<Duration>,
    },
    /// The same operation is still running elsewhere (an idempotency server's "in progress"
    /// answer): ask again, after `after` if the server said when. It is not an answer: if the
    /// layer has to give up on it (the deadline, the attempts or the budget ran out), the
    /// operation ends with an error that says so (`RetryError::is_in_progress`), for the
    /// operation may still complete.
    InProgress {
        /// The server's requested delay; `None` uses the backoff.
        after: Option<Duration>,
    },
    /// Final: another attempt cannot succeed. Return it.
    Stop,
}

/// Classifies an outcome. See the [module docs](self).
///
/// ```
/// use tower_once_core::classify::{Action, Classify};
///
/// // Retry errors, but only those that say they are transient.
/// let transient = |r: &Result<u32, std::io::Error>| match r {
///     Ok(_) => Action::Success,
///     Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => Action::Retry { after: None },
///     Err(_) => Action::Stop,
/// };
/// let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
/// assert_eq!(transient.classify(&Err(refused)), Action::Retry { after: None });
/// ```
pub trait Classify<Res, E> {
    /// The action for `outcome`.
    fn classify(&self, outcome: &Result<Res, E>) -> Action;
}

impl<F, Res, E> Classify<Res, E> for F
where
    F: Fn(&Result<Res, E>) -> Action,
{
    fn classify(&self, outcome: &Result<Res, E>) -> Action {
        self(outcome)
    }
}

/// The default for non-HTTP services: `Ok` is success, every `Err` is retried.
///
/// ```
/// use tower_once_core::classify::{Action, Classify, RetryOnError};
///
/// assert_eq!(RetryOnError.classify(&Ok::<_, ()>(1)), Action::Success);
/// assert_eq!(RetryOnError.classify(&Err::<(), _>("boom")), Action::Retry { after: None });
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct RetryOnError;

impl<Res, E> Classify<Res, E> for RetryOnError {
    fn classify(&self, outcome: &Result<Res, E>) -> Action {
        match outcome {
            Ok(_) => Action::Success,
            Err(_) => Action::Retry { after: None },
        }
    }
}

/// The default for HTTP and gRPC: see the [module docs](self).
///
/// ```
/// use tower_once_core::classify::{Action, Classify, HttpClassifier};
///
/// let response = |status: u16, retry_after: Option<&str>| {
///     let mut builder = http::Response::builder().status(status);
///     if let Some(after) = retry_after {
///         builder = builder.header("retry-after", after);
///     }
///     Ok::<_, ()>(builder.body(()).unwrap())
/// };
/// let c = HttpClassifier::default();
/// assert_eq!(c.classify(&response(200, None)), Action::Success);
/// assert_eq!(c.classify(&response(400, None)), Action::Stop);
/// assert_eq!(c.classify(&response(503, None)), Action::Retry { after: None });
/// assert_eq!(
///     c.classify(&response(429, Some("2"))),
///     Action::Retry { after: Some(std::time::Duration::from_secs(2)) }
/// );
/// assert_eq!(c.classify(&response(409, None)), Action::Stop);
/// assert_eq!(
///     c.classify(&response(409, Some("1"))),
///     Action::InProgress { after: Some(std::time::Duration::from_secs(1)) }
/// );
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct HttpClassifier;

impl<B, E> Classify<Response<B>, E> for HttpClassifier {
    fn classify(&self, outcome: &Result<Response<B>, E>) -> Action {
        let response = match outcome {
            Ok(response) => response,
            Err(_) => return Action::Retry { after: None },
        };
        let headers = response.headers();
        let trailers = response.extensions().get::<Trailers>().map(|t| &t.0);
        let carrier = match trailers {
            _ if Code::is_present(headers) => Some(headers),
            Some(trailers) if Code::is_present(trailers) => Some(trailers),
            _ => None,
        };
        if let Some(carrier) = carrier {
            return match Code::of(carrier) {
                Some(Code::Ok) => Action::Success,
                Some(Code::Unavailable) if says_in_progress(carrier) => {
                    match grpc_pushback(carrier) {
                        Action::Retry { after } => Action::InProgress { after },
                        other => other,
                    }
                }
                Some(Code::Unavailable | Code::ResourceExhausted) => grpc_pushback(carrier),
                _ => Action::Stop,
            };
        }
        let status = response.status();
        if status.is_success() || status.is_informational() || status.is_redirection() {
            return Action::Success;
        }
        match should_retry(headers) {
            Some(false) => return Action::Stop,
            Some(true) if !says_in_progress(headers) => {
                return Action::Retry {
                    after: server_delay(headers),
                }
            }
            _ => {}
        }
        match status {
            StatusCode::REQUEST_TIMEOUT
            | StatusCode::TOO_MANY_REQUESTS
            | StatusCode::INTERNAL_SERVER_ERROR
            | StatusCode::BAD_GATEWAY
            | StatusCode::SERVICE_UNAVAILABLE
            | StatusCode::GATEWAY_TIMEOUT
            | OVERLOADED => Action::Retry {
                after: server_delay(headers),
            },
            StatusCode::CONFLICT => match server_delay(headers) {
                Some(after) => Action::InProgress { after: Some(after) },
                None if says_in_progress(headers) => Action::InProgress { after: None },
                None => Action::Stop,
            },
            _ => Action::Stop,
        }
    }
}

/// `529`: the provider is overloaded (Anthropic's API; some proxies use it too).
const OVERLOADED: StatusCode = match StatusCode::from_u16(529) {
    Ok(status) => status,
    Err(_) => StatusCode::SERVICE_UNAVAILABLE,
};

/// `x-should-retry: true|false`, which the LLM providers' SDKs obey over the status.
fn should_retry(headers: &HeaderMap) -> Option<bool> {
    let value = headers.get("x-should-retry")?.as_bytes();
    if value.eq_ignore_ascii_case(b"true") {
        Some(true)
    } else if value.eq_ignore_ascii_case(b"false") {
        Some(false)
    } else {
        None
    }
}

/// The delay the server asked for: `retry-after-ms` (milliseconds, fractions allowed, as the
/// LLM providers send it) when valid, else `Retry-After`.
fn server_delay(headers: &HeaderMap) -> Option<Duration> {
    let ms = headers
        .get("retry-after-ms")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|ms| ms.is_finite() && *ms >= 0.0);
    match ms {
        // Absurdly long values saturate; the caller caps the wait anyway.
        Some(ms) => Some(Duration::try_from_secs_f64(ms / 1000.0).unwrap_or(Duration::MAX)),
        None => retry_after(headers, SystemTime::now()),
    }
}

/// Whether an idempotency server marked its answer "still in progress"
/// ([`IDEMPOTENCY_IN_PROGRESS`]`: true`).
pub fn says_in_progress(headers: &HeaderMap) -> bool {
    headers
        .get(IDEMPOTENCY_IN_PROGRESS)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"true"))
}

/// gRPC A6: a pushback of `n >= 0` ms retries after it; a negative or malformed one stops.
fn grpc_pushback(headers: &HeaderMap) -> Action {
    match headers.get("grpc-retry-pushback-ms") {
        None => Action::Retry { after: None },
        Some(value) => match value
            .to_str()
            .ok()
            .and_then(|v| v.trim().parse::<i64>().ok())
        {
            Some(ms) if ms >= 0 => Action::Retry {
                after: Some(Duration::from_millis(ms.unsigned_abs())),
            },
            _ => Action::Stop,
        },
    }
}

/// The delay a `Retry-After` header asks for, relative to `now` for the HTTP-date form.
///
/// Accepts delta-seconds (`120`) and an HTTP-date (`Wed, 21 Oct 2015 07:28:00 GMT`); a date in
/// the past means "now" (zero). Anything else is ignored (`None`), as RFC 9110 asks.
///
/// ```
/// use std::time::{Duration, SystemTime, UNIX_EPOCH};
/// use tower_once_core::classify::retry_after;
///
/// let mut headers = http::HeaderMap::new();
/// headers.insert("retry-after", "120".parse().unwrap());
/// assert_eq!(retry_after(&headers, SystemTime::now()), Some(Duration::from_secs(120)));
///
/// let now = UNIX_EPOCH + Duration::from_secs(1_445_412_400); // Wed, 21 Oct 2015 07:26:40 GMT
/// headers.insert("retry-after", "Wed, 21 Oct 2015 07:28:00 GMT".parse().unwrap());
/// assert_eq!(retry_after(&headers, now), Some(Duration::from_secs(80)));
/// ```
pub fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let value = headers
        .get(http::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim();
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        // Absurdly long values saturate rather than fail; the caller caps the wait anyway.
        return Some(Duration::from_secs(value.parse().unwrap_or(u64::MAX)));
    }
    let when = httpdate::parse_http_date(value).ok()?;
    Some(when.duration_since(now).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests;
