//! Finishing a covered request's work on a task of its own when the request is dropped while
//! its handler runs (the client went away).

use crate::detached::Detached;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

/// A covered request's future, boxed so that it can move to a task of its own: if the request
/// is dropped while the handler runs, the handler still runs to completion and its response is
/// stored (unless cancellation was chosen), on a task counted by the layer's [`Detached`].
pub(super) struct FinishOnDrop<Fut: Unfinished + ?Sized> {
    future: Option<Pin<Box<Fut>>>,
    finish: Option<fn(Pin<Box<Fut>>)>,
    // Set while the future is polled: still set at drop, the poll unwound (the handler
    // panicked), and a panicked future is never polled again.
    polling: bool,
}

/// A future that knows whether dropping it now would cut work already started, and which
/// [`Detached`] counts the task that would finish it.
pub(crate) trait Unfinished {
    fn is_unfinished(&self) -> bool;
    fn background(&self) -> &Detached;
}

impl<Fut: Unfinished + Future + Send + ?Sized + 'static> FinishOnDrop<Fut> {
    /// `finish`: whether dropping the request finishes its handler (rather than cancelling it).
    pub(super) fn new(future: Pin<Box<Fut>>, finish: bool) -> Self {
        Self {
            future: Some(future),
            finish: finish.then_some(finish_on_task::<Fut> as fn(Pin<Box<Fut>>)),
            polling: false,
        }
    }
}

fn finish_on_task<Fut: Unfinished + Future + Send + ?Sized + 'static>(future: Pin<Box<Fut>>) {
    tracing::debug!("request dropped while its handler runs; finishing it on a task of its own");
    let background = future.background().clone();
    background.spawn(async move {
        let _ = future.await;
    });
}

impl<Fut: Unfinished + Future + ?Sized> FinishOnDrop<Fut> {
    pub(super) fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Fut::Output> {
        let Some(future) = self.future.as_mut() else {
            tower_once_core::polled_after_completion("ResponseFuture")
        };
        self.polling = true;
        let output = future.as_mut().poll(cx);
        self.polling = false;
        let output = ready!(output);
        self.future = None;
        Poll::Ready(output)
    }
}

impl<Fut: Unfinished + ?Sized> Drop for FinishOnDrop<Fut> {
    fn drop(&mut self) {
        let Some(future) = self.future.take() else {
            return;
        };
        if self.polling {
            // NOTE: the handler panicked. Dropping its future here releases the claim (the
            // claim's guard does on drop), so the client's retry runs the handler again.
            tracing::warn!("idempotency handler panicked; releasing its key");
            return;
        }
        if let Some(finish) = self.finish {
            if future.is_unfinished() {
                finish(future);
            }
        }
    }
}
