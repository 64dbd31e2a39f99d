//! Copies of a request: the hedging layer's mark on a request it may copy, and how a watcher
//! (a fallback) learns that a layer below sent another copy.

use crate::carrier::Carrier;
use std::cell::Cell;

#[doc(hidden)]
/// A request extension the hedging layer puts on a request it may copy while it runs: other
/// copies of it may run too, so the failure of this one alone (even one that was never sent)
/// says nothing of whether the operation ran. A fallback below it sends nothing on for it as
/// unsent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Hedged;

impl Hedged {
    /// Whether `request` is marked so.
    pub fn is_on<R: Carrier + ?Sized>(request: &R) -> bool {
        request
            .extensions()
            .is_some_and(|e| e.get::<Hedged>().is_some())
    }

    /// Marks `request` (when it is a [`Carrier`]).
    pub fn mark<R: Carrier + ?Sized>(request: &mut R) {
        if let Some(extensions) = request.extensions_mut() {
            extensions.insert(Hedged);
        }
    }
}

thread_local! {
    // NOTE: set by a layer that sends another copy of a request (a hedge) while a watcher
    // (a fallback) polls it; read by the watcher right after the poll.
    static COPIED: Cell<bool> = const { Cell::new(false) };
}

#[doc(hidden)]
/// Reports that a layer sent another copy of `request` (a hedge): an error the operation
/// returns later no longer speaks for every copy. A watcher learns it in scope
/// ([`watch_copies`], while it polls on this thread) and through the [`CopyWatch`] the request
/// carries (across a spawned task or a channel).
pub fn note_copy<R: Carrier + ?Sized>(request: &R) {
    COPIED.with(|c| c.set(true));
    if let Some(watch) = request.extensions().and_then(|e| e.get::<CopyWatch>()) {
        watch.0.store(true, std::sync::atomic::Ordering::Release);
    }
}

#[doc(hidden)]
/// A request extension through which a layer below reports that it sent another copy of the
/// request ([`note_copy`]), wherever the request went: the fallback puts one on what it sends
/// to its primary.
#[derive(Debug, Clone, Default)]
pub struct CopyWatch(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl CopyWatch {
    /// Puts a new watch on `request` (when it is a [`Carrier`]) and returns it.
    pub fn attach<R: Carrier + ?Sized>(request: &mut R) -> Option<Self> {
        let extensions = request.extensions_mut()?;
        let watch = Self::default();
        extensions.insert(watch.clone());
        Some(watch)
    }

    /// Whether a copy of the request was sent.
    pub fn copied(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::Acquire)
    }
}

#[doc(hidden)]
/// Runs `f` (a poll of a request's future) and says whether a layer below sent another copy
/// of the request meanwhile ([`note_copy`]): a fallback then no longer takes an unsent error
/// for the whole operation's, for an earlier copy may have run. Reaches what is polled on the
/// same thread, as the attempt's scope does.
pub fn watch_copies<R>(f: impl FnOnce() -> R) -> (R, bool) {
    let (out, copied) = crate::scope::with(&COPIED, false, f);
    // An enclosing watcher learns of it too.
    if copied {
        COPIED.with(|c| c.set(true));
    }
    (out, copied)
}
