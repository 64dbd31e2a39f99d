//! Looking through an error's `source()` chain, boundedly.

use std::error::Error as StdError;

/// The longest chain looked through: chains are short, and the bound guards against a
/// `source()` that loops.
pub const MAX_DEPTH: usize = 32;

/// The first error of `error`'s chain (itself first) for which `f` returns something.
///
/// ```
/// use tower_once_core::chain;
///
/// let io = std::io::Error::other("reset");
/// let found = chain::find_map(&io, |e| e.downcast_ref::<std::io::Error>().map(|e| e.kind()));
/// assert_eq!(found, Some(std::io::ErrorKind::Other));
/// ```
pub fn find_map<'a, T>(
    error: &'a (dyn StdError + 'static),
    mut f: impl FnMut(&'a (dyn StdError + 'static)) -> Option<T>,
) -> Option<T> {
    let mut current = Some(error);
    for _ in 0..MAX_DEPTH {
        let error = current?;
        if let Some(found) = f(error) {
            return Some(found);
        }
        current = error.source();
    }
    None
}

/// The first error of type `T` in `error`'s chain (itself first).
pub fn find<'a, T: StdError + 'static>(error: &'a (dyn StdError + 'static)) -> Option<&'a T> {
    find_map(error, |e| e.downcast_ref::<T>())
}

/// Whether an error of `error`'s chain (itself first) satisfies `f`.
pub fn any(
    error: &(dyn StdError + 'static),
    mut f: impl FnMut(&(dyn StdError + 'static)) -> bool,
) -> bool {
    find_map(error, |e| f(e).then_some(())).is_some()
}
