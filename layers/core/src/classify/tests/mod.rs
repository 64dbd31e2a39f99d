//! The classifier's tests, by subject: statuses (the module docs' table of outcomes and
//! actions, HTTP and gRPC) and `Retry-After` parsing (seconds and HTTP dates, checked with
//! proptest).

mod retry_after;
mod statuses;

use http::HeaderMap;

pub(super) fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.insert(*k, v.parse().unwrap());
    }
    h
}
