//! Moving a covered request's future to a task of its own when the request is dropped while
//! its handler runs.

use super::POLLED_AFTER_COMPLETION;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

/// A covered request's future, boxed so that it can move to a task of its own: if the request
/// is dropped while the handler runs (the client went away), the handler still runs to
/// completion and its response is stored, unless cancellation was chosen.
pub(super) struct Detach<Fut: MustFinish> {
    future: Option<Pin<Box<Fut>>>,
    finish: Option<fn(Pin<Box<Fut>>)>,
}

/// A future that knows whether dropping it now would lose work already started, and where
/// such work is counted.
pub(super) trait MustFinish {
    fn must_finish(&self) -> bool;
    fn detached(&self) -> &crate::Detached;
}

impl<Fut: MustFinish + Future + Send + 'static> Detach<Fut> {
    pub(super) fn new(future: Fut, finish_detached: bool) -> Self {
        Self {
            future: Some(Box::pin(future)),
            finish: finish_detached.then_some(finish_on_task::<Fut> as fn(Pin<Box<Fut>>)),
        }
    }
}

fn finish_on_task<Fut: MustFinish + Future + Send + 'static>(future: Pin<Box<Fut>>) {
    tracing::debug!("request dropped while its handler runs; finishing it on a task of its own");
    let detached = future.detached().clone();
    detached.spawn(async move {
        let _ = future.await;
    });
}

impl<Fut: MustFinish + Future> Detach<Fut> {
    pub(super) fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Fut::Output> {
        let Some(future) = self.future.as_mut() else {
            panic!("{POLLED_AFTER_COMPLETION}")
        };
        let output = ready!(future.as_mut().poll(cx));
        self.future = None;
        Poll::Ready(output)
    }
}

impl<Fut: MustFinish> Drop for Detach<Fut> {
    fn drop(&mut self) {
        if let (Some(future), Some(finish)) = (self.future.take(), self.finish) {
            if future.must_finish() {
                finish(future);
            }
        }
    }
}
