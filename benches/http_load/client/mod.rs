//! The load generator: keep-alive HTTP connections and direct script callers that send back to
//! back for one round, and the warm-up that completes the replay keys.

mod load;
mod warm;

pub(crate) use load::{http_connection, script_caller, HttpTarget, Round, ScriptTarget};
pub(crate) use warm::complete_replay_keys;

use axum::body::Bytes;
use http::header::{CONTENT_TYPE, HOST};
use http::{HeaderValue, Request};
use http_body_util::Full;
use tower_once::idempotency::IDEMPOTENCY_KEY;

/// What one load task counted.
#[derive(Default, Debug)]
pub(crate) struct Counts {
    /// Answers the row expects.
    pub(crate) ok: u64,
    /// Transport errors, and answers the row does not expect.
    pub(crate) unexpected: u64,
}

impl Counts {
    pub(crate) fn add(&mut self, other: Counts) {
        self.ok += other.ok;
        self.unexpected += other.unexpected;
    }
}

/// A covered `POST` of `body` to `path` with `key`, as every HTTP row and the warm-up send it.
fn request(host: HeaderValue, path: &str, key: HeaderValue, body: Bytes) -> Request<Full<Bytes>> {
    Request::post(path)
        .header(HOST, host)
        .header(CONTENT_TYPE, "application/json")
        .header(IDEMPOTENCY_KEY, key)
        .body(Full::new(body))
        .expect("valid request parts")
}
