//! Watching hedges: a hook called each time a hedge is sent.

use std::time::Duration;

/// What the [`OnHedge`] hook is told when a hedge is sent.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct HedgeEvent {
    /// Which hedge of the operation this is: 1 for the first.
    pub hedge: u32,
    /// How long after the first copy was sent.
    pub after: Duration,
}

/// Called each time a hedge is sent, as the retry layer's `OnRetry` before each wait and the
/// fallback's `OnFallback` before the secondary: closures implement it, `()` does nothing.
///
/// A hook is an observer: one that panics is caught and logged (`error`), and the layer goes
/// on as if it had returned, so a bug in it never leaks what the layer holds at that moment.
///
/// ```
/// use std::time::Duration;
/// use tower_once_hedge::{hook::HedgeEvent, HedgeLayer};
///
/// let layer = HedgeLayer::new(Duration::from_millis(100)).on_hedge(|event: &HedgeEvent| {
///     tracing::info!(hedge = event.hedge, after_ms = event.after.as_millis() as u64, "hedged");
/// });
/// # let _ = layer;
/// ```
pub trait OnHedge: Send + Sync + 'static {
    /// Called when a hedge is sent.
    fn on_hedge(&self, event: &HedgeEvent);
}

impl OnHedge for () {
    fn on_hedge(&self, _: &HedgeEvent) {}
}

impl<F> OnHedge for F
where
    F: Fn(&HedgeEvent) + Send + Sync + 'static,
{
    fn on_hedge(&self, event: &HedgeEvent) {
        self(event)
    }
}
