//! A call let through by a circuit, until its outcome is counted.

use crate::circuit::{Admitted, Circuit, Outcome};
use std::sync::Arc;
use tower_once_core::shard::Padded;

/// A call let through by a circuit, until its outcome is counted. Dropped without one (the
/// caller went away), a probe gives its place back, undecided.
#[derive(Debug)]
pub(crate) struct Guard {
    circuit: Arc<Padded<Circuit>>,
    pub(crate) admitted: Admitted,
    settled: bool,
}

impl Guard {
    pub(crate) fn new(circuit: Arc<Padded<Circuit>>, admitted: Admitted) -> Self {
        Self {
            circuit,
            admitted,
            settled: false,
        }
    }

    pub(crate) fn settle(mut self, outcome: Outcome) {
        self.settled = true;
        self.circuit.0.record(self.admitted, outcome);
    }
}

impl Guard {
    /// Whether the admission still stands (its circuit is in the same period).
    pub(crate) fn is_current(&self) -> bool {
        self.circuit.0.still_admits(self.admitted)
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if !self.settled {
            self.circuit.0.release(self.admitted);
        }
    }
}
