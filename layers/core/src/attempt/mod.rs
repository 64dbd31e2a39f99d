//! A retry attempt as the layers below it see it: its number, and what they can tell it back.
//!
//! A retry layer runs each attempt's `call`, and every poll of its future, inside the attempt's
//! [scope](Attempt::scope), and puts the [`Attempt`] on its request when the request type is a
//! [`Carrier`]. The layers below read it with [`Attempt::of`]:
//!
//! - a retry layer below defers to the outer one (one attempt, no multiplying);
//! - a circuit breaker counts an operation once, by its first attempt, and not each retry of it.
//!
//! Back the other way, a layer that refuses an attempt before sending it (an open circuit)
//! [reports](refuse) when the dependency may be tried again; the retry layer that polls the
//! attempt reads it at once ([`Attempt::scope`] returns it), so it waits for the circuit
//! instead of its own backoff, or gives up at once when that is past its deadline. The report
//! lives only for the poll that made it: it reaches the retry layer whose attempt's future is
//! polled on the same thread (a direct call, an `async` block, a `tower::buffer::Buffer`), not
//! one across a spawned task, where the refusal is an ordinary error to the classifier.

mod copies;
mod refusal;

#[doc(hidden)]
pub use self::copies::{note_copy, watch_copies, CopyWatch, Hedged};
pub use self::refusal::Refused;
#[doc(hidden)]
pub use self::refusal::{refuse, withdraw_refusal};

use crate::carrier::Carrier;
use std::cell::Cell;
use std::num::NonZeroU32;

thread_local! {
    // NOTE: set while an attempt's `call` runs and while its future is polled (see
    // `Attempt::scope`); the refusal is reported by a layer below inside that scope and read
    // by the retry layer before the scope ends.
    static SCOPE: Cell<Scope> = const { Cell::new(Scope { attempt: None, refused: None }) };
}

#[derive(Debug, Clone, Copy)]
struct Scope {
    attempt: Option<Attempt>,
    refused: Option<Refused>,
}

/// One attempt of a retried operation: the first is number 1. A request extension (on
/// [`Carrier`] requests) and a thread-local scope. See the [module docs](self).
///
/// ```
/// use tower_once_core::attempt::Attempt;
///
/// let second = Attempt::new(2);
/// assert!(Attempt::current().is_none());
/// let (inside, refused) = second.scope(|| Attempt::current());
/// assert_eq!(inside, Some(second));
/// assert!(refused.is_none());
///
/// let mut req = http::Request::new(());
/// second.attach(&mut req);
/// assert_eq!(Attempt::of(&req).map(Attempt::number), Some(2));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Attempt {
    number: NonZeroU32,
    hedge: bool,
}

impl Attempt {
    /// The first attempt of an operation.
    pub const FIRST: Self = Self {
        number: NonZeroU32::MIN,
        hedge: false,
    };

    /// Attempt number `number` (1 is the first; 0 is taken as 1).
    pub const fn new(number: u32) -> Self {
        match NonZeroU32::new(number) {
            Some(number) => Self {
                number,
                hedge: false,
            },
            None => Self::FIRST,
        }
    }

    /// A hedge of this attempt: a copy sent while it is still running (by the hedging layer).
    pub const fn hedge(self) -> Self {
        Self {
            number: self.number,
            hedge: true,
        }
    }

    /// The attempt's number: 1 for the first (a hedge has the number of the attempt it copies).
    pub const fn number(self) -> u32 {
        self.number.get()
    }

    /// Whether this is a hedge: a copy of an attempt still running.
    pub const fn is_hedge(self) -> bool {
        self.hedge
    }

    /// Whether this is the operation's first attempt: not a retry, not a hedge.
    pub const fn is_first(self) -> bool {
        self.number.get() == 1 && !self.hedge
    }

    /// The attempt in scope on this thread, if any.
    pub fn current() -> Option<Self> {
        SCOPE.with(|s| s.get().attempt)
    }

    /// The attempt `request` belongs to: the one it carries, else the one in scope.
    pub fn of<R: Carrier + ?Sized>(request: &R) -> Option<Self> {
        Self::carried(request).or_else(Self::current)
    }

    /// The attempt `request` carries, if it is a [`Carrier`] with one.
    pub fn carried<R: Carrier + ?Sized>(request: &R) -> Option<Self> {
        request
            .extensions()
            .and_then(|e| e.get::<Attempt>())
            .copied()
    }

    /// Puts this attempt on `request` (when it is a [`Carrier`]), to travel with it.
    pub fn attach<R: Carrier + ?Sized>(self, request: &mut R) {
        if let Some(extensions) = request.extensions_mut() {
            extensions.insert(self);
        }
    }

    /// Runs `f` inside this attempt's scope. Returns what `f` returned and the refusal a layer
    /// below [reported](refuse) while it ran, if any; the enclosing scope is restored after, even
    /// on a panic.
    pub fn scope<R>(self, f: impl FnOnce() -> R) -> (R, Option<Refused>) {
        let inner = Scope {
            attempt: Some(self),
            refused: None,
        };
        let (out, last) = crate::scope::with(&SCOPE, inner, f);
        (out, last.refused)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_refusal_reaches_only_the_attempt_it_was_made_in() {
        refuse(Refused::new(None));
        let (_, outside) = Attempt::FIRST.scope(|| ());
        assert_eq!(outside, None, "a refusal outside any attempt is not kept");

        let after = Some(Duration::from_secs(3));
        let ((), refused) = Attempt::new(2).scope(|| {
            // A nested attempt's refusal stays with it.
            let ((), inner) = Attempt::new(2).scope(|| refuse(Refused::new(None)));
            assert_eq!(inner, Some(Refused::new(None)));
            refuse(Refused::new(after));
        });
        assert_eq!(refused.and_then(Refused::retry_after), after);
        assert_eq!(Attempt::current(), None, "the scope is restored");
    }

    #[test]
    fn the_request_wins_over_the_scope() {
        let mut req = http::Request::new(());
        Attempt::new(3).attach(&mut req);
        let (seen, _) = Attempt::FIRST.scope(|| Attempt::of(&req));
        assert_eq!(seen, Some(Attempt::new(3)));
        assert_eq!(Attempt::of(&"plain"), None);
        assert_eq!(Attempt::new(0), Attempt::FIRST);
        let hedge = Attempt::FIRST.hedge();
        assert!(hedge.is_hedge() && !hedge.is_first() && hedge.number() == 1);
    }
}
