//! One round of one row: concurrent callers, each sending requests through the router back to
//! back (in process: no sockets between caller and app) until the round has passed since they
//! all started.

use crate::app::path;
use crate::rows::{Keys, Row};
use axum::body::Body;
use axum::http::header::CONTENT_TYPE;
use axum::http::{Request, StatusCode};
use axum::Router;
use http_body_util::BodyExt;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Barrier;
use tower::ServiceExt;
use tower_once::idempotency::{IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED};

/// Every request's body.
const BODY: &str = r#"{"amount":5}"#;
/// How long past its end a round may take before the bench gives up.
const GRACE: Duration = Duration::from_secs(30);

/// What the callers of one round counted.
#[derive(Default, Debug)]
pub(crate) struct Counts {
    /// Answers the row expects: `201`, a replay exactly when the row replays.
    pub(crate) ok: u64,
    /// Every other answer.
    pub(crate) unexpected: u64,
}

/// The key task `task` replays: each task its own, so that no two replays of one record run
/// at once (a retry is one client's).
pub(crate) fn replay_key(task: usize) -> String {
    format!("replay-{task}")
}

/// Sends one request of `row` with `key` and says whether the answer is what the row expects.
pub(crate) async fn send(router: &Router, row: &Row, key: &str) -> bool {
    let request = Request::post(path(row.route))
        .header(CONTENT_TYPE, "application/json")
        .header(IDEMPOTENCY_KEY, key)
        .body(Body::from(BODY))
        .expect("valid request parts");
    let Ok(response) = router.clone().oneshot(request).await;
    let expected = response.status() == StatusCode::CREATED
        && response.headers().contains_key(IDEMPOTENT_REPLAYED) == row.replays();
    response.into_body().collect().await.is_ok() && expected
}

/// Runs `row` on `tasks` callers for `length`: the answers counted and the time taken. Fresh
/// keys are `{tag}-t{task}-{n}`.
///
/// # Panics
///
/// If the round does not end within its length and a grace period.
pub(crate) async fn round(
    router: &Router,
    row: &'static Row,
    tag: &str,
    tasks: usize,
    length: Duration,
) -> (Counts, Duration) {
    let start = Arc::new(Barrier::new(tasks + 1));
    let callers: Vec<_> = (0..tasks)
        .map(|task| {
            let (router, start) = (router.clone(), start.clone());
            let prefix = format!("{tag}-t{task}");
            tokio::spawn(async move {
                start.wait().await;
                let end = Instant::now() + length;
                let mut counts = Counts::default();
                let mut n = 0u64;
                while Instant::now() < end {
                    let key = match row.keys {
                        Keys::Fresh => format!("{prefix}-{n}"),
                        Keys::Replay => replay_key(task),
                    };
                    n += 1;
                    if send(&router, row, &key).await {
                        counts.ok += 1;
                    } else {
                        counts.unexpected += 1;
                    }
                }
                counts
            })
        })
        .collect();
    let joined = async move {
        start.wait().await;
        let started = Instant::now();
        let mut total = Counts::default();
        for caller in callers {
            let counts = caller.await.expect("a caller task");
            total.ok += counts.ok;
            total.unexpected += counts.unexpected;
        }
        (total, started.elapsed())
    };
    tokio::time::timeout(length + GRACE, joined)
        .await
        .expect("a round finished within its time and a grace period")
}
