//! The one tracker of the work a layer finishes on tasks of its own, and waiting for it at
//! shutdown: tokio-util's `TaskTracker`, with the store's own tracker beside it.

use std::future::Future;
use tokio_util::task::TaskTracker;

/// The work a layer finishes on tasks of its own, all of it: handlers whose clients went away
/// (they run to completion so their effect is not repeated by the retry), streamed responses
/// whose claim is held until the body ends, and every store write a dropped request left in
/// flight (the completion that stores a response, the release of a key, a claim whose answer had
/// not come), and the writes the store itself sends again after a failure (the Redis store's).
/// Until such a write lands, the client's retry after a restart would meet `409` and
/// then run the handler again.
///
/// A server shutting down gracefully waits for its connections, and these have none left: wait
/// for them too, after the server stopped and before the process exits, or a rolling deploy
/// can cut a handler half-way.
///
/// ```no_run
/// # async fn run(listener: tokio::net::TcpListener) -> std::io::Result<()> {
/// use axum::{routing::post, Router};
/// use std::time::Duration;
/// use tower_once_idempotency::IdempotencyLayer;
///
/// let layer = IdempotencyLayer::new();
/// let detached = layer.detached();
/// let app = Router::new()
///     .route("/charges", post(|| async { "charged" }))
///     .layer(layer);
/// axum::serve(listener, app)
///     .with_graceful_shutdown(async { /* SIGTERM */ })
///     .await?;
/// // Bounded, like the rest of a shutdown.
/// let _ = tokio::time::timeout(Duration::from_secs(30), detached.wait()).await;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Detached {
    tasks: TaskTracker,
    // The store's own background writes (a completion it sends again), waited for after these.
    store: Option<TaskTracker>,
}

impl Default for Detached {
    fn default() -> Self {
        // NOTE: closed from the start, so that `wait` completes whenever no task runs; a
        // closed tracker still takes new tasks.
        let tasks = TaskTracker::new();
        tasks.close();
        Self { tasks, store: None }
    }
}

impl Detached {
    /// How many such tasks are running now.
    pub fn running(&self) -> usize {
        self.tasks.len() + self.store.as_ref().map_or(0, TaskTracker::len)
    }

    /// Completes once no such task is running.
    pub async fn wait(&self) {
        // The layer's first: a write it finishes may leave the store one to send again.
        self.tasks.wait().await;
        if let Some(store) = &self.store {
            store.wait().await;
        }
    }

    /// This tracker, also covering the background writes of a store (see
    /// [`IdempotencyStore::background`](crate::store::IdempotencyStore::background)).
    pub(crate) fn including(&self, store: Option<Detached>) -> Self {
        Self {
            tasks: self.tasks.clone(),
            store: store.map(|s| s.tasks),
        }
    }

    /// Runs `work` on a task of its own, counted until it ends (a panic included).
    pub(crate) fn spawn(&self, work: impl Future<Output = ()> + Send + 'static) {
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(
                "no tokio runtime to finish idempotency work on; the key frees itself when its \
                 lease expires"
            );
            return;
        };
        drop(self.tasks.spawn_on(work, &handle));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn wait_returns_once_every_task_ended() {
        let detached = Detached::default();
        detached.wait().await; // nothing running: at once
        for ms in [10, 50] {
            detached.spawn(tokio::time::sleep(Duration::from_millis(ms)));
        }
        assert_eq!(detached.running(), 2);
        let started = tokio::time::Instant::now();
        detached.wait().await;
        assert_eq!(started.elapsed(), Duration::from_millis(50));
        assert_eq!(detached.running(), 0);
    }
}
