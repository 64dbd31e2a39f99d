//! The worker: reads and takes over entries, runs them on the handler service, and stops
//! gracefully.

use crate::classify::JobClassifier;
use crate::config::WorkerConfig;
use crate::consume::{self, Ctx};
use crate::error::WorkerError;
use crate::fetch::Fetch;
use crate::job::Job;
use crate::metrics::JobOutcome;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
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
use tower_once_core::slots::Slots;
use tower_once_retry::classify::Classify;
use tower_service::Service;

/// A Redis Streams consumer that runs each entry on a `tower::Service<Job>`. See the
/// [crate docs](crate) for the semantics.
pub struct Worker<S, C = JobClassifier, Conn = ConnectionManager> {
    config: WorkerConfig,
    service: S,
    classifier: C,
    reader: Conn,
    conn: Conn,
}

impl<S, C, Conn> fmt::Debug for Worker<S, C, Conn> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Worker")
            .field("config", &self.config)
            .field("service", &std::any::type_name::<S>())
            .field("classifier", &std::any::type_name::<C>())
            .field("connection", &std::any::type_name::<Conn>())
            .finish()
    }
}

impl<S> Worker<S> {
    /// A worker on one Redis server, e.g. `redis://127.0.0.1:6379`. It opens two reconnecting
    /// connections (one for the blocking `XREADGROUP`, one for everything else) lazily, so it
    /// starts while Redis is down and recovers on its own after a restart.
    pub fn connect(url: &str, config: WorkerConfig, service: S) -> Result<Self, WorkerError> {
        config.validate().map_err(WorkerError::config)?;
        let client = redis::Client::open(url)?;
        let timeout = config.command_timeout;
        let manager = |response: Duration| {
            let c = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(timeout))
                .set_response_timeout(Some(response))
                .set_number_of_retries(1)
                .set_max_delay(Duration::from_secs(1));
            ConnectionManager::new_lazy_with_config(client.clone(), c)
        };
        let reader = manager(config.effective_block() + timeout)?;
        let conn = manager(timeout)?;
        Self::new(config, reader, conn, service)
    }
}

impl<S> Worker<S, JobClassifier, ClusterConnection> {
    /// A worker on a Redis Cluster, through any of its nodes. Name the stream with a hash tag
    /// (`{jobs}`) so it and its dead-letter stream share a slot.
    pub async fn connect_cluster<I, T>(
        nodes: I,
        config: WorkerConfig,
        service: S,
    ) -> Result<Self, WorkerError>
    where
        I: IntoIterator<Item = T>,
        T: redis::IntoConnectionInfo,
    {
        config.validate().map_err(WorkerError::config)?;
        let nodes: Vec<redis::ConnectionInfo> = nodes
            .into_iter()
            .map(redis::IntoConnectionInfo::into_connection_info)
            .collect::<Result<_, _>>()?;
        let timeout = config.command_timeout;
        let connect = |response: Duration| {
            let nodes = nodes.clone();
            async move {
                redis::cluster::ClusterClientBuilder::new(nodes)
                    .connection_timeout(timeout)
                    .response_timeout(response)
                    .build()?
                    .get_async_connection()
                    .await
            }
        };
        let reader = connect(config.effective_block() + timeout).await?;
        let conn = connect(timeout).await?;
        Self::new(config, reader, conn, service)
    }
}

impl<S, Conn> Worker<S, JobClassifier, Conn> {
    /// A worker over two connections of any kind: `reader` carries only the blocking
    /// `XREADGROUP` (its response timeout must exceed [`WorkerConfig::effective_block`]),
    /// `conn` everything else. Checks the config ([`WorkerError::is_config`]).
    pub fn new(
        config: WorkerConfig,
        reader: Conn,
        conn: Conn,
        service: S,
    ) -> Result<Self, WorkerError> {
        config.validate().map_err(WorkerError::config)?;
        Ok(Self {
            config,
            service,
            classifier: JobClassifier,
            reader,
            conn,
        })
    }
}

impl<S, C, Conn> Worker<S, C, Conn> {
    /// Classifies outcomes with `classifier` instead of [`JobClassifier`].
    pub fn classify<C2>(self, classifier: C2) -> Worker<S, C2, Conn> {
        Worker {
            config: self.config,
            service: self.service,
            classifier,
            reader: self.reader,
            conn: self.conn,
        }
    }

    /// The settings.
    pub fn config(&self) -> &WorkerConfig {
        &self.config
    }

    /// Runs until `shutdown` completes, then stops reading (a read in progress is let finish,
    /// within [`WorkerConfig::effective_block`], and its entries run), waits up to the shutdown
    /// grace for in-flight jobs and returns what happened. Redis errors never end the run: the worker
    /// backs off (up to 5 s) and tries again, recreating the group if Redis lost it.
    pub async fn run<F>(self, shutdown: F) -> RunReport
    where
        F: Future<Output = ()>,
        S: Service<Job> + Clone + Send + 'static,
        S::Future: Send + 'static,
        S::Response: Send + 'static,
        S::Error: fmt::Display + Send + 'static,
        C: Classify<S::Response, S::Error> + Send + Sync + 'static,
        Conn: ConnectionLike + Clone + Send + Sync + 'static,
    {
        let config = self.config;
        let concurrency = config.concurrency;
        let slots = Slots::new(concurrency);
        let (acks, ack_rx) = mpsc::channel(concurrency);
        let mut acker = AbortOnDropHandle::new(tokio::spawn(consume::ack_loop(
            self.conn.clone(),
            config.clone(),
            ack_rx,
            concurrency.max(64),
        )));
        let ctx = Arc::new(Ctx {
            config,
            classifier: self.classifier,
            conn: self.conn,
            in_flight: Mutex::new(HashSet::with_capacity(concurrency)),
            acks,
            claim_at: Mutex::new(std::collections::BinaryHeap::new()),
        });
        // Both helpers end with this future, even when it is dropped rather than finished.
        let mut refresher =
            AbortOnDropHandle::new(tokio::spawn(consume::refresh_loop(ctx.clone())));
        let mut tasks = JoinSet::new();
        let mut report = RunReport::default();
        let mut fetch = Fetch::new(self.reader);
        let mut not_ready = tower_once_core::outage::Outage::default();
        tokio::pin!(shutdown);
        loop {
            while let Some(done) = tasks.try_join_next() {
                report.record(done);
            }
            if is_ready(shutdown.as_mut()) {
                break;
            }
            let free = slots.free(tasks.len());
            // Refill in batches: with jobs still running, wait until a quarter of the slots is
            // free, so one read serves many jobs instead of one read per finished job.
            if !slots.refill(tasks.len()) {
                tokio::select! {
                    biased;
                    () = &mut shutdown => break,
                    Some(done) = tasks.join_next() => report.record(done),
                }
                continue;
            }
            // NOTE: no entry is fetched that its handler is not ready to run: one ready
            // service per entry. A handler that is not ready (a circuit breaker gating on an
            // open circuit, a concurrency limit) holds the fetch back, so an outage of its
            // dependency costs no delivery and dead-letters nothing.
            let ready = tokio::select! {
                biased;
                () = &mut shutdown => break,
                ready = ready_services(self.service.clone(), free.min(ctx.config.batch_size)) => ready,
            };
            let Some(ready) = ready else {
                // The handler failed its readiness: fetch nothing, try again after a pause.
                let pause = not_ready.failed();
                if not_ready.should_warn() {
                    tracing::warn!(
                        failures = not_ready.failures(),
                        "handler not ready (its poll_ready failed); not fetching"
                    );
                }
                tokio::select! {
                    biased;
                    () = &mut shutdown => break,
                    () = tokio::time::sleep(pause) => {}
                }
                continue;
            };
            not_ready.recovered();
            // NOTE: a read is never cancelled. A dropped XREADGROUP may still be queued in the
            // connection and reach Redis later, handing entries to a consumer that has stopped
            // (they would wait a claim_idle for a takeover). It returns within `block`; its
            // entries then run within the shutdown grace.
            let fetched = fetch.next(&ctx, ready.len()).await;
            match fetched {
                Ok(batch) => {
                    // Services readied beyond the batch are dropped: what they hold (a
                    // half-open circuit's probe) goes back.
                    for ((entry, deliveries), mut service) in batch.into_iter().zip(ready) {
                        // NOTE: readiness may have lapsed while the read blocked (a circuit
                        // that opened meanwhile): such an entry is given back unrun, its
                        // delivery count restored, rather than refused by its handler.
                        if !still_ready(&mut service) {
                            consume::give_back(&ctx, &entry.id).await;
                            continue;
                        }
                        tasks.spawn(consume::process(ctx.clone(), service, entry, deliveries));
                    }
                }
                Err(e) => {
                    let pause = fetch.failed(&e);
                    tokio::select! {
                        biased;
                        () = &mut shutdown => break,
                        () = tokio::time::sleep(pause) => {}
                    }
                }
            }
        }
        drain(&mut tasks, &mut report, ctx.config.shutdown_grace).await;
        refresher.abort();
        let _ = (&mut refresher).await;
        let command_timeout = ctx.config.command_timeout;
        drop(ctx);
        // Every sender is gone now: the acker sends what it holds and ends.
        let _ = tokio::time::timeout(command_timeout * 2, &mut acker).await;
        report
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

/// What a [`Worker::run`] did, by [`JobOutcome`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RunReport {
    /// Deliveries acknowledged.
    pub acked: u64,
    /// Deliveries left pending (transient failures, missed deadlines).
    pub left_pending: u64,
    /// Deliveries dead-lettered.
    pub dead_lettered: u64,
    /// Deliveries dropped when the shutdown grace ended (left pending).
    pub abandoned: u64,
}

impl RunReport {
    fn record(&mut self, done: Result<JobOutcome, tokio::task::JoinError>) {
        match done {
            Ok(JobOutcome::Acked) => self.acked += 1,
            Ok(JobOutcome::DeadLettered) => self.dead_lettered += 1,
            Ok(JobOutcome::Abandoned) => self.abandoned += 1,
            // A handler that panicked never acknowledged: its entry is pending.
            Ok(JobOutcome::LeftPending) | Err(_) => self.left_pending += 1,
        }
    }
}
