//! The response future: the first attempt, hedges sent after the delay, the first good answer.

use crate::config::Config;
use crate::hook::HedgeEvent;
use crate::plan::{Copies, Plan};
use pin_project_lite::pin_project;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use tokio::time::{Instant, Sleep};
use tower_once_core::attempt::Attempt;
use tower_once_core::carrier::Carrier;
use tower_once_core::classify::{Action, Classify};
use tower_once_core::deadline::Deadline;
use tower_once_core::shard::Padded;
use tower_service::Service;

pin_project! {
    /// Response future of [`Hedge`](crate::Hedge).
    pub struct ResponseFuture<S, Req, K, C>
    where
        S: Service<Req>,
    {
        #[pin]
        first: First<S::Future>,
        hedges: Vec<Pin<Box<S::Future>>>,
        #[pin]
        timer: Option<Sleep>,
        plan: Option<Plan<S, K>>,
        config: Arc<Padded<Config<S, C>>>,
        // A failure, or a "still in progress" answer, returned when nothing better comes.
        kept: Option<Result<S::Response, S::Error>>,
        kept_in_progress: bool,
        started: Instant,
        // The mark hedges are polled under: what a layer below reports of a hedge (a refusal)
        // stays with it.
        hedge_mark: Attempt,
    }
}

pin_project! {
    #[project = FirstProj]
    enum First<F> {
        Running { #[pin] future: F },
        Done,
    }
}

impl<S, Req, K, C> ResponseFuture<S, Req, K, C>
where
    S: Service<Req>,
{
    pub(crate) fn new(
        first: S::Future,
        plan: Option<Plan<S, K>>,
        config: Arc<Padded<Config<S, C>>>,
        started: Instant,
    ) -> Self {
        let timer = plan.as_ref().map(|p| {
            tokio::time::sleep_until(tower_once_core::time::saturating_add(started, p.delay))
        });
        let hedge_mark = plan.as_ref().map_or(Attempt::FIRST.hedge(), |p| p.mark);
        Self {
            first: First::Running { future: first },
            hedges: Vec::new(),
            timer,
            plan,
            config,
            kept: None,
            kept_in_progress: false,
            started,
            hedge_mark,
        }
    }
}

/// What an attempt's outcome does to the operation.
enum Settled<T> {
    /// The answer: return it.
    Answer(T),
    /// Kept in case nothing better comes.
    Kept,
}

impl<S, Req, K, C> Future for ResponseFuture<S, Req, K, C>
where
    S: Service<Req> + Clone,
    Req: Carrier,
    K: Copies<Req>,
    C: Classify<S::Response, S::Error>,
{
    type Output = Result<S::Response, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            if let FirstProj::Running { future } = this.first.as_mut().project() {
                if let Poll::Ready(outcome) = future.poll(cx) {
                    this.first.set(First::Done);
                    let config = &this.config.0;
                    let action = config.classifier.classify(&outcome);
                    if let (Action::Success, crate::config::When::Percentile(latency)) =
                        (action, &config.when)
                    {
                        let now = Instant::now();
                        latency.record(now, now.saturating_duration_since(*this.started));
                    }
                    if let Settled::Answer(answer) =
                        settle(action, outcome, this.kept, this.kept_in_progress)
                    {
                        this.hedges.clear();
                        return Poll::Ready(answer);
                    }
                }
            }
            let mut i = 0;
            while i < this.hedges.len() {
                let hedge = this.hedges[i].as_mut();
                let (poll, _) = this.hedge_mark.scope(|| hedge.poll(cx));
                let Poll::Ready(outcome) = poll else {
                    i += 1;
                    continue;
                };
                drop(this.hedges.swap_remove(i));
                let action = this.config.0.classifier.classify(&outcome);
                if let Settled::Answer(answer) =
                    settle(action, outcome, this.kept, this.kept_in_progress)
                {
                    crate::metrics::win();
                    tracing::debug!("a hedge answered first");
                    this.first.set(First::Done);
                    this.hedges.clear();
                    return Poll::Ready(answer);
                }
            }
            let running = matches!(*this.first, First::Running { .. }) || !this.hedges.is_empty();
            if !running {
                // NOTE: a failure with nothing else in flight is returned at once: retrying
                // failures is a retry layer's work, hedging only cuts slowness.
                if let Some(kept) = this.kept.take() {
                    *this.plan = None;
                    return Poll::Ready(kept);
                }
            }
            if this.plan.is_none() {
                return Poll::Pending;
            }
            let Some(timer) = this.timer.as_mut().as_pin_mut() else {
                return Poll::Pending;
            };
            ready!(timer.poll(cx));
            match send_hedge(this.plan, &this.config.0, *this.started, cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => {
                    *this.plan = None;
                    this.timer.set(None);
                }
                Poll::Ready(Some(future)) => {
                    this.hedges.push(Box::pin(future));
                    match this.plan.as_ref().filter(|plan| plan.left > 0) {
                        Some(plan) => {
                            let at =
                                tower_once_core::time::saturating_add(Instant::now(), plan.delay);
                            if let Some(timer) = this.timer.as_mut().as_pin_mut() {
                                timer.reset(at);
                            }
                        }
                        None => {
                            *this.plan = None;
                            this.timer.set(None);
                        }
                    }
                }
            }
        }
    }
}

/// What an outcome means: the answer (a success, or a final outcome), or one to keep while
/// other attempts run (a failure; a "still in progress", which is kept over a failure: another
/// copy holds the claim and may still answer).
fn settle<R, E>(
    action: Action,
    outcome: Result<R, E>,
    kept: &mut Option<Result<R, E>>,
    kept_in_progress: &mut bool,
) -> Settled<Result<R, E>> {
    match action {
        Action::InProgress { .. } => {
            *kept = Some(outcome);
            *kept_in_progress = true;
            Settled::Kept
        }
        Action::Retry { .. } => {
            if !*kept_in_progress {
                *kept = Some(outcome);
            }
            Settled::Kept
        }
        _ => Settled::Answer(outcome),
    }
}

/// Sends one hedge, if the deadline and the budget allow: `Ready(None)` when no more will be
/// sent, `Pending` while the service is not ready.
fn send_hedge<S, Req, K, C>(
    plan: &mut Option<Plan<S, K>>,
    config: &Config<S, C>,
    started: Instant,
    cx: &mut Context<'_>,
) -> Poll<Option<S::Future>>
where
    S: Service<Req> + Clone,
    Req: Carrier,
    K: Copies<Req>,
{
    let Some(plan) = plan.as_mut() else {
        return Poll::Ready(None);
    };
    // NOTE: no hedge at or after the deadline: it could not answer in time.
    if plan.deadline.is_some_and(Deadline::is_expired) {
        return Poll::Ready(None);
    }
    let service = plan.service.get_or_insert_with(|| config.service.clone());
    match service.poll_ready(cx) {
        Poll::Pending => return Poll::Pending,
        Poll::Ready(Err(_)) => return Poll::Ready(None),
        Poll::Ready(Ok(())) => {}
    }
    // NOTE: hedges draw on the retry budget: in an outage, slow answers do not multiply load.
    if let Some(budget) = &config.budget {
        if !budget.withdraw() {
            crate::metrics::budget_refusal();
            tracing::debug!("hedge refused by the retry budget");
            return Poll::Ready(None);
        }
    }
    let mut request = plan.source.copy();
    plan.mark.attach(&mut request);
    if let Some(deadline) = plan.deadline {
        deadline.attach(&mut request);
    }
    plan.left -= 1;
    // NOTE: a fallback above learns that a copy beyond the first went out: an error this
    // operation returns no longer says that nothing ran.
    tower_once_core::attempt::note_copy(&request);
    crate::metrics::hedge();
    tracing::debug!(left = plan.left, "no answer yet: hedging");
    if let Some(hook) = &config.hook {
        let event = HedgeEvent {
            hedge: config.max_hedges - plan.left,
            after: started.elapsed(),
        };
        tower_once_core::hook::call("hedge", || hook.on_hedge(&event));
    }
    let (future, _) = plan.mark.scope(|| match plan.deadline {
        Some(deadline) => deadline.scope(|| service.call(request)),
        None => service.call(request),
    });
    Poll::Ready(Some(future))
}
