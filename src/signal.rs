//! Waiting for the signal that asks a process to stop: SIGTERM (what container runtimes,
//! systemd and Kubernetes send) or SIGINT (Ctrl-C) on unix, Ctrl-C elsewhere.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// A future that resolves when the process is asked to stop: on unix at the first SIGTERM or
/// SIGINT, elsewhere at the first Ctrl-C. Container runtimes, systemd and Kubernetes stop a
/// process with SIGTERM, not Ctrl-C. Give it to whatever waits for shutdown: axum's
/// `with_graceful_shutdown`, `Worker::run` or `OutboxRelay::run`, and the requests, jobs and
/// sends in flight finish before the process exits 0. Feature `signal` (on by default, and with
/// `worker` and `outbox`).
///
/// On unix the handlers are installed when this is called, not when the future is first
/// polled, so a signal that arrives in between is not missed: call it before announcing that
/// the process is ready. (Elsewhere, tokio's `ctrl_c` installs its handler on the first poll.)
/// Once installed, handlers stay for the life of the process (tokio's rule): a second SIGTERM
/// does not kill a process that is shutting down; its own bounds (`shutdown_grace`) do. A
/// handler that cannot be installed (the OS refused it) is not waited for; if none can be,
/// the future never resolves and the process stops only when killed.
///
/// ```no_run
/// # #[tokio::main]
/// # async fn main() -> std::io::Result<()> {
/// let app = axum::Router::new().route("/", axum::routing::get(|| async { "ok" }));
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
/// // Requests in flight finish; then `serve` returns and the process exits 0.
/// axum::serve(listener, app)
///     .with_graceful_shutdown(tower_once::shutdown_signal())
///     .await
/// # }
/// ```
///
/// Behind an `IdempotencyLayer`, handlers whose clients went away run on tasks of their own;
/// wait for them too, after the server stopped, so the effects they started are recorded
/// (every example of this repository stops this way):
///
/// ```no_run
/// # #[cfg(feature = "idempotency")]
/// # async fn run() -> std::io::Result<()> {
/// use axum::{routing::post, Router};
/// use tower_once::idempotency::IdempotencyLayer;
///
/// let layer = IdempotencyLayer::new().require_key(true);
/// let detached = layer.detached();
/// let app = Router::new()
///     .route("/charges", post(|| async { (http::StatusCode::CREATED, "charged") }))
///     .layer(layer);
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
/// axum::serve(listener, app)
///     .with_graceful_shutdown(tower_once::shutdown_signal())
///     .await?;
/// detached.wait().await; // and handlers whose clients had gone away
/// # Ok(())
/// # }
/// ```
///
/// # Panics
///
/// Outside a Tokio runtime with I/O enabled (as `#[tokio::main]` builds), like
/// `tokio::signal`.
pub fn shutdown_signal() -> ShutdownSignal {
    ShutdownSignal {
        inner: Inner::install(),
    }
}

/// The future [`shutdown_signal`] returns.
#[must_use = "futures do nothing unless polled"]
pub struct ShutdownSignal {
    inner: Inner,
}

impl Future for ShutdownSignal {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.inner.poll(cx)
    }
}

impl std::fmt::Debug for ShutdownSignal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShutdownSignal").finish_non_exhaustive()
    }
}

#[cfg(unix)]
struct Inner {
    term: Option<tokio::signal::unix::Signal>,
    interrupt: Option<tokio::signal::unix::Signal>,
}

#[cfg(unix)]
impl Inner {
    fn install() -> Self {
        use tokio::signal::unix::{signal, SignalKind};
        Self {
            term: signal(SignalKind::terminate()).ok(),
            interrupt: signal(SignalKind::interrupt()).ok(),
        }
    }

    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        // `None` from `poll_recv` means the runtime is going away: no signal will come.
        let mut fired = |signal: &mut Option<tokio::signal::unix::Signal>| {
            signal
                .as_mut()
                .is_some_and(|s| matches!(s.poll_recv(cx), Poll::Ready(Some(()))))
        };
        // Both are polled, so both wake this task.
        let term = fired(&mut self.term);
        let interrupt = fired(&mut self.interrupt);
        if term || interrupt {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

#[cfg(not(unix))]
struct Inner {
    ctrl_c: Option<Pin<Box<dyn Future<Output = std::io::Result<()>> + Send>>>,
}

#[cfg(not(unix))]
impl Inner {
    fn install() -> Self {
        Self {
            ctrl_c: Some(Box::pin(tokio::signal::ctrl_c())),
        }
    }

    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let Some(ctrl_c) = self.ctrl_c.as_mut() else {
            return Poll::Pending;
        };
        match ctrl_c.as_mut().poll(cx) {
            Poll::Ready(Ok(())) => Poll::Ready(()),
            Poll::Ready(Err(_)) => {
                // No handler: never resolves, as documented.
                self.ctrl_c = None;
                Poll::Pending
            }
            Poll::Pending => Poll::Pending,
        }
    }
}
