//! Calling a user's hook (a closure told of a retry, a hedge, a fallback, a circuit's state
//! change) so that its panic never leaves a layer half-way through a step: the panic is caught
//! and logged, and the layer goes on as if the hook had returned.
//!
//! The layers' own plumbing; not part of the stable API.

use std::panic::{catch_unwind, AssertUnwindSafe};

/// Runs `hook`; a panic in it is caught and logged at `error` with `layer`'s name.
///
/// NOTE: a hook is an observer, called in the middle of a step (a probe's place reserved, a
/// retry's budget withdrawn): unwinding from there would leak what the step holds.
#[inline]
pub fn call(layer: &'static str, hook: impl FnOnce()) {
    if catch_unwind(AssertUnwindSafe(hook)).is_err() {
        tracing::error!(layer, "a hook panicked; the layer went on without it");
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_panicking_hook_is_contained() {
        let mut after = false;
        super::call("test", || panic!("hook bug"));
        super::call("test", || after = true);
        assert!(after);
    }
}
