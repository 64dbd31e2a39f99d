//! The worker's run loop as a struct with one method per step (tower `buffer/worker.rs`'s
//! shape): wait for a slot, ready the handlers, fetch, dispatch, and at the end drain.

use crate::config::WorkerConfig;
use crate::consume::{self, Ctx};
use crate::fetch::Fetch;
use crate::job::Job;
use crate::metrics::JobOutcome;
use crate::report::RunReport;
use redis::aio::ConnectionLike;
use std::collections::HashSet;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::Context;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::task::AbortOnDropHandle;
use tower_once_core::outage::Outage;
use tower_once_core::slots::Slots;
use tower_once_retry::classify::Classify;
use tower_service::Service;

/// Whether the loop goes on.
pub(crate) enum Turn {
    Again,
    Stop,
}

/// One run of a worker: its helpers (the acknowledger, the claim refresher), its jobs in
/// flight and what it has done so far.
pub(crate) struct RunLoop<S, C, Conn> {
    service: S,
    ctx: Arc<Ctx<C, Conn>>,
    slots: Slots,
    tasks: JoinSet<JobOutcome>,
    report: RunReport,
    fetch: Fetch<Conn>,
    not_ready: Outage,
    // Both helpers end with the loop, even when it is dropped rather than finished.
    acker: AbortOnDropHandle<()>,
    refresher: AbortOnDropHandle<()>,
}

impl<S, C, Conn> RunLoop<S, C, Conn>
where
    S: Service<Job> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
    S::Error: fmt::Display + Send + 'static,
    C: Classify<S::Response, S::Error> + Send + Sync + 'static,
    Conn: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// Starts the helpers.
    pub(crate) fn start(
        config: WorkerConfig,
        service: S,
        classifier: C,
        reader: Conn,
        conn: Conn,
    ) -> Self {
        let concurrency = config.concurrency;
        let (acks, ack_rx) = mpsc::channel(concurrency);
        let acker = AbortOnDropHandle::new(tokio::spawn(consume::ack_loop(
            conn.clone(),
            config.clone(),
            ack_rx,
            concurrency.max(64),
        )));
        let ctx = Arc::new(Ctx {
            config,
            classifier,
            conn,
            in_flight: Mutex::new(HashSet::with_capacity(concurrency)),
            acks,
            claim_at: Mutex::new(std::collections::BinaryHeap::new()),
        });
        let refresher = AbortOnDropHandle::new(tokio::spawn(consume::refresh_loop(ctx.clone())));
        Self {
            service,
            ctx,
            slots: Slots::new(concurrency),
            tasks: JoinSet::new(),
            report: RunReport::default(),
            fetch: Fetch::new(reader),
            not_ready: Outage::default(),
            acker,
            refresher,
        }
    }

    /// One turn: records finished jobs, then waits for free slots, readies handlers, fetches
    /// and dispatches; `Stop` once `shutdown` completed.
    pub(crate) async fn turn<F: Future<Output = ()>>(&mut self, mut shutdown: Pin<&mut F>) -> Turn {
        while let Some(done) = self.tasks.try_join_next() {
            self.report.record(done);
        }
        if is_ready(shutdown.as_mut()) {
            return Turn::Stop;
        }
        let free = self.slots.free(self.tasks.len());
        // Refill in batches: with jobs still running, wait until a quarter of the slots is
        // free, so one read serves many jobs instead of one read per finished job.
        if !self.slots.refill(self.tasks.len()) {
            tokio::select! {
                biased;
                () = &mut shutdown => return Turn::Stop,
                Some(done) = self.tasks.join_next() => self.report.record(done),
            }
            return Turn::Again;
        }
        // NOTE: no entry is fetched that its handler is not ready to run: one ready service
        // per entry. A handler that is not ready (a circuit breaker gating on an open circuit,
        // a concurrency limit) holds the fetch back, so an outage of its dependency costs no
        // delivery and dead-letters nothing.
        let want = free.min(self.ctx.config.batch_size);
        let ready = tokio::select! {
            biased;
            () = &mut shutdown => return Turn::Stop,
            ready = ready_services(self.service.clone(), want) => ready,
        };
        let Some(ready) = ready else {
            return self.pause_not_ready(shutdown).await;
        };
        self.not_ready.recovered();
        // NOTE: a read is never cancelled. A dropped XREADGROUP may still be queued in the
        // connection and reach Redis later, handing entries to a consumer that has stopped
        // (they would wait a claim_idle for a takeover). It returns within `block`; its
        // entries then run within the shutdown grace.
        match self.fetch.next(&self.ctx, ready.len()).await {
            Ok(batch) => {
                self.dispatch(batch, ready).await;
                Turn::Again
            }
            Err(e) => {
                let pause = self.fetch.failed(&e);
                sleep_or_stop(shutdown, pause).await
            }
        }
    }

    /// The handler failed its readiness: fetch nothing, try again after a pause.
    async fn pause_not_ready<F: Future<Output = ()>>(&mut self, shutdown: Pin<&mut F>) -> Turn {
        let pause = self.not_ready.failed();
        if self.not_ready.should_warn() {
            tracing::warn!(
                failures = self.not_ready.failures(),
                "handler not ready (its poll_ready failed); not fetching"
            );
        }
        sleep_or_stop(shutdown, pause).await
    }

    /// Runs each fetched entry on a ready service of its own. Services readied beyond the
    /// batch are dropped: what they hold (a half-open circuit's probe) goes back.
    async fn dispatch(&mut self, batch: Vec<(crate::streams::Entry, u64)>, ready: Vec<S>) {
        for ((entry, deliveries), mut service) in batch.into_iter().zip(ready) {
            // NOTE: readiness may have lapsed while the read blocked (a circuit that opened
            // meanwhile): such an entry is given back unrun, its delivery count restored,
            // rather than refused by its handler.
            if !still_ready(&mut service) {
                consume::give_back(&self.ctx, &entry.id).await;
                continue;
            }
            let ctx = self.ctx.clone();
            self.tasks
                .spawn(consume::process(ctx, service, entry, deliveries));
        }
    }

    /// Waits for the jobs in flight (up to the shutdown grace), stops the helpers and lets the
    /// acknowledger send what it holds.
    pub(crate) async fn finish(mut self) -> RunReport {
        drain(
            &mut self.tasks,
            &mut self.report,
            self.ctx.config.shutdown_grace,
        )
        .await;
        self.refresher.abort();
        let _ = (&mut self.refresher).await;
        let command_timeout = self.ctx.config.command_timeout;
        drop(self.ctx);
        // Every sender is gone now: the acknowledger sends what it holds and ends.
        let _ = tokio::time::timeout(command_timeout * 2, &mut self.acker).await;
        self.report
    }
}

/// Sleeps `pause`, or stops when `shutdown` completes first.
async fn sleep_or_stop<F: Future<Output = ()>>(shutdown: Pin<&mut F>, pause: Duration) -> Turn {
    tokio::select! {
        biased;
        () = shutdown => Turn::Stop,
        () = tokio::time::sleep(pause) => Turn::Again,
    }
}

/// Up to `want` clones of `service`, each ready for one call: waits for the first, then takes
/// as many more as are ready at once. `None` when the first one's readiness failed.
async fn ready_services<S, Req>(service: S, want: usize) -> Option<Vec<S>>
where
    S: Service<Req> + Clone,
{
    let mut first = service.clone();
    std::future::poll_fn(|cx| first.poll_ready(cx)).await.ok()?;
    let mut ready = Vec::with_capacity(want.max(1));
    ready.push(first);
    // NOTE: the closure owns the service (a `&S` held across the await would ask `S: Sync`
    // of every handler).
    std::future::poll_fn(move |cx| {
        while ready.len() < want {
            let mut next = service.clone();
            match next.poll_ready(cx) {
                std::task::Poll::Ready(Ok(())) => ready.push(next),
                _ => break,
            }
        }
        std::task::Poll::Ready(Some(std::mem::take(&mut ready)))
    })
    .await
}

/// Whether a service readied earlier is ready still, asked without waiting.
fn still_ready<S: Service<Req>, Req>(service: &mut S) -> bool {
    let mut cx = Context::from_waker(std::task::Waker::noop());
    matches!(service.poll_ready(&mut cx), std::task::Poll::Ready(Ok(())))
}

/// Whether `future` has completed, without waiting for it.
fn is_ready<F: Future<Output = ()>>(future: Pin<&mut F>) -> bool {
    let mut cx = Context::from_waker(std::task::Waker::noop());
    future.poll(&mut cx).is_ready()
}

/// Waits for in-flight jobs up to `grace`, then drops the rest (left pending).
async fn drain(tasks: &mut JoinSet<JobOutcome>, report: &mut RunReport, grace: Duration) {
    let deadline = tokio::time::sleep(grace);
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            biased;
            done = tasks.join_next() => match done {
                Some(done) => report.record(done),
                None => return,
            },
            () = &mut deadline => break,
        }
    }
    tracing::warn!(
        jobs = tasks.len(),
        "shutdown grace ended; in-flight jobs dropped and left pending"
    );
    report.abandoned += tasks.len() as u64;
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
}
