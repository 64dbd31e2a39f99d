//! One circuit: its state machine, its counts, and the decisions made on them.
//!
//! Reads are lock-free: a call in the closed state loads one word. Counting a probe in or out
//! is one compare-and-swap on that word. Transitions (trip, half-open, close, by hand) take a
//! mutex only one transition at a time holds, so the break's end and the half-open start are
//! written before the new state is published; no call ever waits on it in the closed state.

mod idle;
mod transition;
pub(crate) mod window;
pub(crate) mod word;

use self::window::Window;
use self::word::Word;
use crate::config::{Policy, Trip};
use crate::hook::Cause;
use crate::CircuitState;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::*};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// A circuit, shared by every call that goes through it.
#[derive(Debug, Clone)]
pub(crate) struct Circuit {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    name: Arc<str>,
    word: AtomicU64,
    /// When the break ends (nanoseconds since the policy's origin), while open.
    open_until: AtomicU64,
    /// When it became half-open, while half-open.
    half_open_since: AtomicU64,
    /// Trips in a row since it last closed on probes (for the break's backoff).
    trips: AtomicU32,
    /// The last break, for decorrelated jitter.
    last_break: AtomicU64,
    /// Failures in a row (consecutive mode).
    consecutive: AtomicU32,
    /// When a call last went through it, in whole seconds since the policy's origin: a keyed
    /// circuit used lately (maybe with calls still under way) is never evicted.
    last_used: AtomicU64,
    /// The sampling window (ratio mode).
    window: Option<Window>,
    transitions: Mutex<()>,
    policy: Arc<Policy>,
}

/// How a call was let through: in the closed state (counted or not), or as a probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admitted {
    Closed { generation: u32, counted: bool },
    Probe { generation: u32 },
}

/// What an outcome means to the circuit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Success,
    Failure,
    /// The caller's fault, or "still in progress": says nothing of the dependency's health.
    Neutral,
}

/// Why a call was refused, and when a probe is admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Refusal {
    pub(crate) state: CircuitState,
    pub(crate) retry_after: Option<Duration>,
}

impl Circuit {
    pub(crate) fn new(name: Arc<str>, policy: Arc<Policy>) -> Self {
        let window = match policy.trip {
            Trip::Ratio { window, .. } => Some(Window::new(window)),
            Trip::Consecutive(_) => None,
        };
        Self {
            shared: Arc::new(Shared {
                name,
                word: AtomicU64::new(Word::INITIAL.0),
                open_until: AtomicU64::new(0),
                half_open_since: AtomicU64::new(0),
                trips: AtomicU32::new(0),
                last_break: AtomicU64::new(0),
                consecutive: AtomicU32::new(0),
                last_used: AtomicU64::new(0),
                window,
                transitions: Mutex::new(()),
                policy,
            }),
        }
    }

    pub(crate) fn name(&self) -> &Arc<str> {
        &self.shared.name
    }

    /// Whether `other` is this very circuit.
    pub(crate) fn same_as(&self, other: &Circuit) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }

    fn word(&self) -> Word {
        Word(self.shared.word.load(Acquire))
    }

    pub(crate) fn state(&self) -> CircuitState {
        self.word().state()
    }

    /// Nanoseconds since the policy's origin.
    fn now(&self) -> u64 {
        nanos(Instant::now().saturating_duration_since(self.shared.policy.origin))
    }

    /// Lets a call through, or says why not. `counted`: whether its outcome may count in the
    /// closed state (the first attempt of an operation, or every call).
    #[inline]
    pub(crate) fn admit(&self, counted: bool) -> Result<Admitted, Refusal> {
        let word = self.word();
        if word.state() == CircuitState::Closed {
            return Ok(Admitted::Closed {
                generation: word.generation(),
                counted,
            });
        }
        self.admit_slow(word, counted)
    }

    #[cold]
    fn admit_slow(&self, mut word: Word, counted: bool) -> Result<Admitted, Refusal> {
        let now = self.now();
        let shared = &self.shared;
        loop {
            match word.state() {
                CircuitState::Closed => {
                    return Ok(Admitted::Closed {
                        generation: word.generation(),
                        counted,
                    })
                }
                CircuitState::Isolated => {
                    return Err(Refusal {
                        state: CircuitState::Isolated,
                        retry_after: None,
                    })
                }
                CircuitState::Open => {
                    let until = shared.open_until.load(Acquire);
                    if now < until {
                        return Err(Refusal {
                            state: CircuitState::Open,
                            retry_after: Some(Duration::from_nanos(until - now)),
                        });
                    }
                    // The break is over: this call moves the circuit to half-open and is its
                    // first probe.
                    if let Some(next) =
                        self.transition(word, CircuitState::HalfOpen, Cause::BreakOver, now)
                    {
                        return Ok(Admitted::Probe {
                            generation: next.generation(),
                        });
                    }
                }
                CircuitState::HalfOpen => {
                    let since = shared.half_open_since.load(Acquire);
                    let limit = nanos(shared.policy.max_half_open_wait);
                    if now.saturating_sub(since) >= limit {
                        // NOTE: half-open can never get stuck: probes that hang (or a circuit
                        // nobody calls) open it again after the longest wait.
                        self.transition(word, CircuitState::Open, Cause::HalfOpenTimeout, now);
                    } else if word.probes() + word.successes() < shared.policy.probes {
                        let next = word.with_counts(word.probes() + 1, word.successes());
                        if shared
                            .word
                            .compare_exchange(word.0, next.0, AcqRel, Acquire)
                            .is_ok()
                        {
                            return Ok(Admitted::Probe {
                                generation: word.generation(),
                            });
                        }
                    } else {
                        return Err(Refusal {
                            state: CircuitState::HalfOpen,
                            retry_after: None,
                        });
                    }
                }
            }
            word = self.word();
        }
    }

    /// Whether an admission made earlier (and held, by a gated service) still stands: the
    /// circuit is in the same period.
    pub(crate) fn still_admits(&self, admitted: Admitted) -> bool {
        let word = self.word();
        match admitted {
            Admitted::Closed { generation, .. } => {
                word.state() == CircuitState::Closed && word.generation() == generation
            }
            Admitted::Probe { generation } => {
                word.state() == CircuitState::HalfOpen && word.generation() == generation
            }
        }
    }

    /// Counts the outcome of a call it let through.
    #[inline]
    pub(crate) fn record(&self, admitted: Admitted, outcome: Outcome) {
        match admitted {
            Admitted::Closed {
                generation,
                counted,
            } => {
                if counted && outcome != Outcome::Neutral {
                    self.record_closed(generation, outcome == Outcome::Failure);
                }
            }
            Admitted::Probe { generation } => self.record_probe(generation, outcome),
        }
    }

    fn record_closed(&self, generation: u32, failure: bool) {
        let word = self.word();
        // A call let through in an earlier closed period says nothing of this one.
        if word.state() != CircuitState::Closed || word.generation() != generation {
            return;
        }
        let shared = &self.shared;
        match (shared.policy.trip, &shared.window) {
            (
                Trip::Ratio {
                    ratio,
                    min_throughput,
                    ..
                },
                Some(window),
            ) => {
                let now = self.now();
                let epoch = window.epoch(now);
                window.record(epoch, failure);
                if failure {
                    let sums = window.sums(epoch);
                    if sums.total >= u64::from(min_throughput)
                        && sums.failures as f64 >= ratio * sums.total as f64
                    {
                        self.transition(word, CircuitState::Open, Cause::Failures, now);
                    }
                }
            }
            (Trip::Consecutive(n), _) => {
                if failure {
                    if shared.consecutive.fetch_add(1, AcqRel).saturating_add(1) >= n {
                        self.transition(word, CircuitState::Open, Cause::Failures, self.now());
                    }
                } else if shared.consecutive.load(Relaxed) != 0 {
                    // Written only when there is something to reset: a success in a healthy
                    // circuit reads a line every core shares and writes nothing.
                    shared.consecutive.store(0, Relaxed);
                }
            }
            (Trip::Ratio { .. }, None) => {}
        }
    }

    fn record_probe(&self, generation: u32, outcome: Outcome) {
        let shared = &self.shared;
        let mut word = self.word();
        loop {
            if word.state() != CircuitState::HalfOpen || word.generation() != generation {
                return;
            }
            let probes = word.probes().saturating_sub(1);
            let next = match outcome {
                Outcome::Failure => {
                    self.transition(word, CircuitState::Open, Cause::ProbeFailed, self.now());
                    return;
                }
                Outcome::Success if word.successes() + 1 >= shared.policy.probes => {
                    self.transition(
                        word,
                        CircuitState::Closed,
                        Cause::ProbesSucceeded,
                        self.now(),
                    );
                    return;
                }
                Outcome::Success => word.with_counts(probes, word.successes() + 1),
                Outcome::Neutral => word.with_counts(probes, word.successes()),
            };
            match shared
                .word
                .compare_exchange(word.0, next.0, AcqRel, Acquire)
            {
                Ok(_) => return,
                Err(actual) => word = Word(actual),
            }
        }
    }

    /// A call let through that ended without an outcome (its future was dropped): a probe's
    /// place is given back, undecided.
    pub(crate) fn release(&self, admitted: Admitted) {
        if let Admitted::Probe { generation } = admitted {
            self.record_probe(generation, Outcome::Neutral);
        }
    }
}

/// A duration in nanoseconds, saturating (about 584 years).
fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests;
