//! The state machine against a small model of the crate docs' semantics tables: random
//! sequences of calls let through, outcomes (success, failure, neither, dropped), clock steps
//! and manual steering; after every step the circuit's answer (admitted as what, or refused
//! with which state and wait) and its state must be the model's. Paused time, consecutive
//! failures, breaks doubling without jitter.

use super::{Admitted, Circuit, Outcome};
use crate::config::{Settings, Trip};
use crate::CircuitState;
use proptest::prelude::*;
use std::sync::Arc;
use std::time::Duration;
use tower_once_core::backoff::{Backoff, Jitter};

const FAILURES: u32 = 3;
const BASE_S: u64 = 2;
const CAP_S: u64 = 8;
const PROBES: u32 = 2;
const MAX_HALF_OPEN_S: u64 = 10;

#[derive(Debug, Clone)]
enum Op {
    /// A call: counted (a first attempt) or not.
    Admit {
        counted: bool,
    },
    /// The outcome of the in-flight call at this index (modulo their number).
    Finish {
        at: usize,
        outcome: Outcome,
    },
    /// The in-flight call at this index is dropped.
    Drop {
        at: usize,
    },
    /// Seconds pass.
    Advance {
        secs: u64,
    },
    Isolate,
    Close,
    Reset,
}

fn op() -> impl Strategy<Value = Op> {
    let outcome = prop_oneof![
        Just(Outcome::Success),
        Just(Outcome::Failure),
        Just(Outcome::Neutral)
    ];
    prop_oneof![
        6 => any::<bool>().prop_map(|counted| Op::Admit { counted }),
        6 => (any::<usize>(), outcome).prop_map(|(at, outcome)| Op::Finish { at, outcome }),
        1 => any::<usize>().prop_map(|at| Op::Drop { at }),
        3 => (0u64..6).prop_map(|secs| Op::Advance { secs }),
        1 => Just(Op::Isolate),
        1 => Just(Op::Close),
        1 => Just(Op::Reset),
    ]
}

/// What the model says a call gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    Closed { generation: u32, counted: bool },
    Probe { generation: u32 },
    Refused(CircuitState, Option<u64>),
}

#[derive(Debug, Default)]
struct Model {
    state: Option<CircuitState>,
    generation: u32,
    probes: u32,
    successes: u32,
    consecutive: u32,
    trips: u32,
    open_until: u64,
    half_open_since: u64,
    now: u64,
}

impl Model {
    fn state(&self) -> CircuitState {
        self.state.unwrap_or(CircuitState::Closed)
    }

    fn next(&mut self, state: CircuitState) {
        self.state = Some(state);
        self.generation += 1;
        self.probes = 0;
        self.successes = 0;
    }

    fn trip(&mut self) {
        self.trips += 1;
        let length = (BASE_S << (self.trips - 1).min(16)).min(CAP_S);
        self.open_until = self.now + length;
        self.next(CircuitState::Open);
    }

    fn close(&mut self, by_probes: bool) {
        self.next(CircuitState::Closed);
        self.consecutive = 0;
        if by_probes {
            self.trips = 0;
        }
    }

    fn admit(&mut self, counted: bool) -> Answer {
        loop {
            match self.state() {
                CircuitState::Closed => {
                    return Answer::Closed {
                        generation: self.generation,
                        counted,
                    }
                }
                CircuitState::Isolated => return Answer::Refused(CircuitState::Isolated, None),
                CircuitState::Open if self.now < self.open_until => {
                    return Answer::Refused(CircuitState::Open, Some(self.open_until - self.now))
                }
                CircuitState::Open => {
                    self.next(CircuitState::HalfOpen);
                    self.probes = 1;
                    self.half_open_since = self.now;
                    return Answer::Probe {
                        generation: self.generation,
                    };
                }
                CircuitState::HalfOpen if self.now - self.half_open_since >= MAX_HALF_OPEN_S => {
                    self.trip()
                }
                CircuitState::HalfOpen if self.probes + self.successes < PROBES => {
                    self.probes += 1;
                    return Answer::Probe {
                        generation: self.generation,
                    };
                }
                CircuitState::HalfOpen => return Answer::Refused(CircuitState::HalfOpen, None),
            }
        }
    }

    fn record(&mut self, admitted: Answer, outcome: Outcome) {
        match admitted {
            Answer::Closed {
                generation,
                counted,
            } => {
                if !counted
                    || outcome == Outcome::Neutral
                    || self.state() != CircuitState::Closed
                    || generation != self.generation
                {
                    return;
                }
                if outcome == Outcome::Success {
                    self.consecutive = 0;
                } else {
                    self.consecutive += 1;
                    if self.consecutive >= FAILURES {
                        self.trip();
                    }
                }
            }
            Answer::Probe { generation } => {
                if self.state() != CircuitState::HalfOpen || generation != self.generation {
                    return;
                }
                match outcome {
                    Outcome::Failure => self.trip(),
                    Outcome::Success if self.successes + 1 >= PROBES => self.close(true),
                    Outcome::Success => {
                        self.successes += 1;
                        self.probes -= 1;
                    }
                    Outcome::Neutral => self.probes -= 1,
                }
            }
            Answer::Refused(..) => {}
        }
    }
}

fn answer(result: Result<Admitted, super::Refusal>) -> Answer {
    match result {
        Ok(Admitted::Closed {
            generation,
            counted,
        }) => Answer::Closed {
            generation,
            counted,
        },
        Ok(Admitted::Probe { generation }) => Answer::Probe { generation },
        Err(refusal) => Answer::Refused(
            refusal.state,
            refusal.retry_after.map(|d| {
                assert_eq!(d.subsec_nanos(), 0, "whole seconds in this model");
                d.as_secs()
            }),
        ),
    }
}

fn circuit() -> Circuit {
    let settings = Settings {
        trip: Trip::Consecutive(FAILURES),
        breaks: Backoff::new(Duration::from_secs(BASE_S), 2.0, Duration::from_secs(CAP_S))
            .unwrap()
            .jitter(Jitter::None),
        probes: PROBES,
        max_half_open_wait: Duration::from_secs(MAX_HALF_OPEN_S),
        ..Settings::default()
    };
    Circuit::new(Arc::from("model"), Arc::new(settings.policy()))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn the_circuit_behaves_as_the_model(ops in proptest::collection::vec(op(), 1..120)) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        rt.block_on(async {
            let circuit = circuit();
            let mut model = Model::default();
            // Calls let through and not finished: the circuit's admission and the model's.
            let mut in_flight: Vec<(Admitted, Answer)> = Vec::new();
            for (step, op) in ops.into_iter().enumerate() {
                match op {
                    Op::Admit { counted } => {
                        let real = circuit.admit(counted);
                        let expected = model.admit(counted);
                        prop_assert_eq!(answer(real), expected, "step {}", step);
                        if let Ok(admitted) = real {
                            in_flight.push((admitted, expected));
                        }
                    }
                    Op::Finish { at, outcome } if !in_flight.is_empty() => {
                        let (admitted, expected) = in_flight.remove(at % in_flight.len());
                        circuit.record(admitted, outcome);
                        model.record(expected, outcome);
                    }
                    Op::Drop { at } if !in_flight.is_empty() => {
                        let (admitted, expected) = in_flight.remove(at % in_flight.len());
                        circuit.release(admitted);
                        model.record(expected, Outcome::Neutral);
                    }
                    Op::Finish { .. } | Op::Drop { .. } => {}
                    Op::Advance { secs } => {
                        tokio::time::advance(Duration::from_secs(secs)).await;
                        model.now += secs;
                    }
                    Op::Isolate => {
                        circuit.isolate();
                        if model.state() != CircuitState::Isolated {
                            model.next(CircuitState::Isolated);
                        }
                    }
                    Op::Close => {
                        circuit.close(false);
                        model.close(false);
                    }
                    Op::Reset => {
                        circuit.close(true);
                        model.close(false);
                        model.trips = 0;
                    }
                }
                prop_assert_eq!(circuit.state(), model.state(), "step {}", step);
            }
            Ok(())
        })?;
    }
}
