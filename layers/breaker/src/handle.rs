//! Reading and steering circuits by hand.

use crate::circuit::Circuit;
use crate::registry::Registry;
use crate::CircuitState;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// The circuits of one layer (and of every service it made), to read and steer by hand: from
/// [`CircuitBreakerLayer::circuits`](crate::CircuitBreakerLayer::circuits).
///
/// ```
/// use tower_once_breaker::{CircuitBreakerLayer, CircuitState};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let layer = CircuitBreakerLayer::http();
/// let circuits = layer.circuits();
/// // Take a host out of rotation during its maintenance, then put it back.
/// let host = circuits.circuit("https://payments.example.com");
/// host.isolate();
/// assert_eq!(host.state(), CircuitState::Isolated);
/// host.close();
/// assert_eq!(circuits.circuit("").state(), CircuitState::Closed, "the default circuit");
/// # }
/// ```
#[derive(Clone)]
pub struct Circuits {
    pub(crate) registry: Arc<Registry>,
}

impl Circuits {
    /// The circuit named `key` (`""`: the layer's default circuit), made if there is none yet.
    /// A circuit made by hand is always that key's own, even past
    /// [`max_circuits`](crate::CircuitBreakerLayer::max_circuits) (which bounds the keys
    /// requests bring): isolating a host never isolates the others with it.
    pub fn circuit(&self, key: &str) -> CircuitHandle {
        self.handle(self.registry.circuit(key))
    }

    /// The circuit named `key`, if requests (or [`circuit`](Self::circuit)) made it.
    pub fn find(&self, key: &str) -> Option<CircuitHandle> {
        self.registry.find(key).map(|circuit| self.handle(circuit))
    }

    /// The circuit new keys share when the bound is reached and no circuit is idle (its key
    /// is `(overflow)`; [`CircuitHandle::is_overflow`] tells it from a key spelled so).
    pub fn overflow(&self) -> CircuitHandle {
        self.handle(self.registry.overflow())
    }

    /// Every circuit: the default one first, then the keyed ones, and the overflow one.
    pub fn all(&self) -> Vec<CircuitHandle> {
        self.registry
            .all()
            .into_iter()
            .map(|circuit| self.handle(circuit))
            .collect()
    }

    fn handle(&self, circuit: crate::circuit::Circuit) -> CircuitHandle {
        CircuitHandle {
            overflow: self.registry.is_overflow(&circuit),
            circuit,
        }
    }
}

impl fmt::Debug for Circuits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Circuits")
            .field("policy", self.registry.policy())
            .finish_non_exhaustive()
    }
}

/// One circuit, to read and steer by hand.
#[derive(Clone)]
pub struct CircuitHandle {
    circuit: Circuit,
    overflow: bool,
}

impl CircuitHandle {
    /// Its key (`""` for the layer's default circuit).
    pub fn key(&self) -> &str {
        self.circuit.name()
    }

    /// Whether it is the circuit new keys share at the bound ([`Circuits::overflow`]).
    pub fn is_overflow(&self) -> bool {
        self.overflow
    }

    /// Its state now.
    pub fn state(&self) -> CircuitState {
        self.circuit.state()
    }

    /// How long until its answer to a call may change: the end of its break when open, the
    /// longest half-open wait left when half-open; `None` when closed or isolated.
    pub fn next_change(&self) -> Option<Duration> {
        self.circuit.next_change()
    }

    /// Opens it until [`close`](Self::close) or [`reset`](Self::reset): every call is refused
    /// (Polly's and resilience4j's manual isolation), for maintenance or an incident.
    pub fn isolate(&self) {
        self.circuit.isolate();
    }

    /// Closes it, with an empty window; it still remembers its recent trips, so tripping again
    /// soon means a longer break.
    pub fn close(&self) {
        self.circuit.close(false);
    }

    /// Closes it and forgets everything: counts and recent trips.
    pub fn reset(&self) {
        self.circuit.close(true);
    }
}

impl fmt::Debug for CircuitHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CircuitHandle")
            .field("key", &self.key())
            .field("state", &self.state())
            .finish()
    }
}
