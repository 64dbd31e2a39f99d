//! A circuit's state, packed in one word so that admitting a probe, counting its success and
//! every transition are each one compare-and-swap, and a stale outcome (of a call admitted in
//! an earlier period) is told apart by its generation.
//!
//! | bits | field |
//! |---|---|
//! | 0–1 | state: closed, open, half-open, isolated |
//! | 2–17 | probes in flight (half-open) |
//! | 18–33 | probes that succeeded (half-open) |
//! | 34–63 | generation: one more at every transition |

use crate::CircuitState;

const STATE_BITS: u32 = 2;
const COUNT_BITS: u32 = 16;
const COUNT_MASK: u64 = (1 << COUNT_BITS) - 1;
const PROBES_SHIFT: u32 = STATE_BITS;
const SUCCESSES_SHIFT: u32 = PROBES_SHIFT + COUNT_BITS;
const GEN_SHIFT: u32 = SUCCESSES_SHIFT + COUNT_BITS;

/// The most probes a half-open circuit admits (the counters' width).
pub(crate) const MAX_PROBES: u32 = COUNT_MASK as u32;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Word(pub(crate) u64);

impl Word {
    /// A closed circuit of generation 0.
    pub(crate) const INITIAL: Self = Self(0);

    pub(crate) fn state(self) -> CircuitState {
        match self.0 & 0b11 {
            0 => CircuitState::Closed,
            1 => CircuitState::Open,
            2 => CircuitState::HalfOpen,
            _ => CircuitState::Isolated,
        }
    }

    pub(crate) fn generation(self) -> u32 {
        (self.0 >> GEN_SHIFT) as u32
    }

    pub(crate) fn probes(self) -> u32 {
        ((self.0 >> PROBES_SHIFT) & COUNT_MASK) as u32
    }

    pub(crate) fn successes(self) -> u32 {
        ((self.0 >> SUCCESSES_SHIFT) & COUNT_MASK) as u32
    }

    /// The next period: `state`, one generation on, no probes.
    pub(crate) fn next(self, state: CircuitState) -> Self {
        let generation = u64::from(self.generation().wrapping_add(1)) & ((1 << 30) - 1);
        Self((generation << GEN_SHIFT) | code(state))
    }

    /// The same period with `probes` in flight and `successes` counted.
    pub(crate) fn with_counts(self, probes: u32, successes: u32) -> Self {
        let keep = self.0 & !((COUNT_MASK << PROBES_SHIFT) | (COUNT_MASK << SUCCESSES_SHIFT));
        Self(
            keep | ((u64::from(probes) & COUNT_MASK) << PROBES_SHIFT)
                | ((u64::from(successes) & COUNT_MASK) << SUCCESSES_SHIFT),
        )
    }

    /// Whether `other` is the same period (state and generation), whatever its counts.
    pub(crate) fn same_period(self, other: Self) -> bool {
        self.state() == other.state() && self.generation() == other.generation()
    }
}

const fn code(state: CircuitState) -> u64 {
    match state {
        CircuitState::Closed => 0,
        CircuitState::Open => 1,
        CircuitState::HalfOpen => 2,
        CircuitState::Isolated => 3,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_round_trip_and_generations_wrap() {
        let w = Word::INITIAL.next(CircuitState::HalfOpen).with_counts(3, 7);
        assert_eq!(w.state(), CircuitState::HalfOpen);
        assert_eq!((w.probes(), w.successes(), w.generation()), (3, 7, 1));
        let w = w.with_counts(MAX_PROBES, MAX_PROBES);
        assert_eq!((w.probes(), w.successes()), (MAX_PROBES, MAX_PROBES));
        assert_eq!(w.state(), CircuitState::HalfOpen);
        let mut last = Word::INITIAL;
        for _ in 0..5 {
            last = last.next(CircuitState::Open);
        }
        assert_eq!(last.generation(), 5);
        let top = Word(((1u64 << 30) - 1) << GEN_SHIFT);
        assert_eq!(top.next(CircuitState::Closed).generation(), 0, "wraps");
        assert!(!top.same_period(top.next(CircuitState::Closed)));
    }
}
