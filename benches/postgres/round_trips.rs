//! Round trips to PostgreSQL per request, counted from sqlx's statement events: each statement
//! sqlx logs is one round trip. A transaction's `BEGIN` is not logged, though sqlx 0.8 sends it
//! and waits for its answer (one more round trip for every row with a transaction, the
//! transactional claim's `BEGIN` with its lock included); its `COMMIT` is logged.
//!
//! The counting layer is installed once, for the whole bench, and counts only while a count is
//! taken (an atomic flag read by `enabled`), so the timed rounds pay one relaxed load per
//! statement, on every row alike.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use tracing::subscriber::Interest;
use tracing::{Event, Metadata, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

/// sqlx's target for statement events.
const TARGET: &str = "sqlx::query";

static COUNTING: AtomicBool = AtomicBool::new(false);
static STATEMENTS: AtomicU64 = AtomicU64::new(0);

struct CountStatements;

impl<S: Subscriber> Layer<S> for CountStatements {
    fn register_callsite(&self, metadata: &'static Metadata<'static>) -> Interest {
        if metadata.target() == TARGET {
            Interest::sometimes()
        } else {
            Interest::never()
        }
    }

    fn enabled(&self, metadata: &Metadata<'_>, _: Context<'_, S>) -> bool {
        metadata.target() == TARGET && COUNTING.load(Relaxed)
    }

    fn on_event(&self, _: &Event<'_>, _: Context<'_, S>) {
        STATEMENTS.fetch_add(1, Relaxed);
    }
}

/// Installs the counting layer as the global subscriber.
///
/// # Panics
///
/// If a global subscriber is set already.
pub(crate) fn install() {
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(CountStatements))
        .expect("no other global subscriber");
}

/// The statements sqlx logs while `work` runs (nothing else may send any meanwhile).
pub(crate) async fn count<F: std::future::Future<Output = ()>>(work: F) -> u64 {
    STATEMENTS.store(0, Relaxed);
    COUNTING.store(true, Relaxed);
    work.await;
    COUNTING.store(false, Relaxed);
    STATEMENTS.load(Relaxed)
}
