//! Watching circuits: a hook called on every state change.

use crate::CircuitState;
use std::time::Duration;

/// Why a circuit changed state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Cause {
    /// Failures (or slow calls) reached the threshold while it was closed.
    Failures,
    /// The break was over: the next call is a probe.
    BreakOver,
    /// Enough probes succeeded.
    ProbesSucceeded,
    /// A probe failed.
    ProbeFailed,
    /// It stayed half-open longer than the most allowed without a decision (its probes
    /// hung, or nobody called).
    HalfOpenTimeout,
    /// [`isolate`](crate::CircuitHandle::isolate), [`close`](crate::CircuitHandle::close) or
    /// [`reset`](crate::CircuitHandle::reset).
    Manual,
}

impl Cause {
    /// A stable lowercase name: `failures`, `break_over`, `probes_succeeded`, `probe_failed`,
    /// `half_open_timeout`, `manual`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Failures => "failures",
            Self::BreakOver => "break_over",
            Self::ProbesSucceeded => "probes_succeeded",
            Self::ProbeFailed => "probe_failed",
            Self::HalfOpenTimeout => "half_open_timeout",
            Self::Manual => "manual",
        }
    }
}

impl std::fmt::Display for Cause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the [`on_state_change`](crate::CircuitBreakerLayer::on_state_change) hook is told.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct StateChange<'a> {
    /// The circuit's key (`""` for the layer's default circuit).
    pub circuit: &'a str,
    /// The state it left.
    pub from: CircuitState,
    /// The state it entered.
    pub to: CircuitState,
    /// Why.
    pub cause: Cause,
    /// When it opened: how long until it admits a probe.
    pub open_for: Option<Duration>,
}

/// Called on every state change of every circuit, by the call that made it, as the retry
/// layer's `OnRetry` before each wait: closures implement it, `()` does nothing.
///
/// A hook is an observer: one that panics is caught and logged (`error`), and the layer goes
/// on as if it had returned, so a bug in it never leaks what the layer holds at that moment.
pub trait OnStateChange: Send + Sync + 'static {
    /// Called when a circuit changed state.
    fn on_state_change(&self, change: &StateChange<'_>);
}

impl OnStateChange for () {
    fn on_state_change(&self, _: &StateChange<'_>) {}
}

impl<F> OnStateChange for F
where
    F: Fn(&StateChange<'_>) + Send + Sync + 'static,
{
    fn on_state_change(&self, change: &StateChange<'_>) {
        self(change)
    }
}
