//! A value set on the thread while a closure runs, and restored after it, even on a panic: how
//! an operation's context (its deadline, the attempt's mark, a watch for copies) reaches the
//! layers that a call and a poll go through in the same task.
//!
//! The one scope guard of every layer; not part of the stable API.

use std::cell::Cell;
use std::thread::LocalKey;

/// Runs `f` with `slot` set to `value`. Returns what `f` returned and the slot's value when `f`
/// ended (a layer below may have changed it); the previous value is back in the slot after,
/// however `f` ended.
#[inline]
pub fn with<T: Copy + 'static, R>(
    slot: &'static LocalKey<Cell<T>>,
    value: T,
    f: impl FnOnce() -> R,
) -> (R, T) {
    struct Restore<T: Copy + 'static> {
        slot: &'static LocalKey<Cell<T>>,
        previous: T,
    }
    impl<T: Copy + 'static> Drop for Restore<T> {
        fn drop(&mut self) {
            self.slot.with(|c| c.set(self.previous));
        }
    }
    let previous = slot.with(|c| c.replace(value));
    let _restore = Restore { slot, previous };
    let out = f();
    (out, slot.with(Cell::get))
}

#[cfg(test)]
mod tests {
    use super::*;

    thread_local! {
        static SLOT: Cell<u8> = const { Cell::new(0) };
    }

    #[test]
    fn the_previous_value_is_restored_even_after_a_panic() {
        let (out, last) = with(&SLOT, 1, || {
            let inner = with(&SLOT, 2, || SLOT.with(|s| s.set(3)));
            assert_eq!(inner, ((), 3));
            SLOT.with(Cell::get)
        });
        assert_eq!((out, last), (1, 1));
        assert_eq!(SLOT.with(Cell::get), 0);
        let panicked = std::panic::catch_unwind(|| with(&SLOT, 9, || panic!("below")));
        assert!(panicked.is_err());
        assert_eq!(SLOT.with(Cell::get), 0);
    }
}
