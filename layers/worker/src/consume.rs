//! One delivery, start to finish, plus the two helpers every delivery relies on: the acker
//! (batched `XACK`) and the refresher (keeps in-flight entries from being taken over).

use crate::config::WorkerConfig;
use crate::dead_letter::{self, DeadReason, Letter};
use crate::job::{Job, JobId};
use crate::metrics::{self, JobOutcome};
use crate::streams::{self, Entry, DELAY_SCRIPT, GIVE_BACK_SCRIPT, REFRESH_SCRIPT};
use bytes::Bytes;
use redis::aio::ConnectionLike;
use redis::{Script, Value};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashSet};
use std::fmt::{self, Write as _};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::sync::mpsc;
use tower_once_core::backoff::Backoff;
use tower_once_retry::classify::{Action, Classify};
use tower_once_timeout::Deadline;
use tower_service::Service;
use tracing::Instrument;

/// The longest error text kept in a dead letter.
const MAX_ERROR_TEXT: usize = 1024;

/// What every delivery task shares.
pub(crate) struct Ctx<C, Conn> {
    pub(crate) config: WorkerConfig,
    pub(crate) classifier: C,
    pub(crate) conn: Conn,
    /// Ids of entries whose handler is running; at most `concurrency` of them.
    pub(crate) in_flight: Mutex<HashSet<String>>,
    pub(crate) acks: mpsc::Sender<String>,
    /// When held-back entries become claimable again (earliest first, at most
    /// [`MAX_CLAIM_TIMES`]): the fetcher takes over idle entries then instead of waiting for
    /// its regular pass.
    pub(crate) claim_at: Mutex<BinaryHeap<Reverse<tokio::time::Instant>>>,
}

/// Keeps an entry in the refresher's set while its handler runs.
struct InFlight<'a>(&'a Mutex<HashSet<String>>, String);

impl<'a> InFlight<'a> {
    fn enter(set: &'a Mutex<HashSet<String>>, id: &str) -> Self {
        set.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id.to_owned());
        metrics::in_flight(1.0);
        Self(set, id.to_owned())
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.1);
        metrics::in_flight(-1.0);
    }
}

/// Runs one delivery: dead-letter it unrun, or call the handler and act on the outcome.
pub(crate) async fn process<S, C, Conn>(
    ctx: Arc<Ctx<C, Conn>>,
    service: S,
    entry: Entry,
    deliveries: u64,
) -> JobOutcome
where
    S: Service<Job>,
    S::Error: fmt::Display,
    C: Classify<S::Response, S::Error>,
    Conn: ConnectionLike + Clone + Send,
{
    let job_id = entry.field(b"job_id").and_then(JobId::from_field);
    let span = tracing::info_span!(
        "job",
        job_id = job_id.as_ref().map_or("", JobId::as_str),
        stream_id = %entry.id,
        deliveries,
        outcome = tracing::field::Empty,
    );
    async move {
        let outcome = deliver(&ctx, service, &entry, job_id, deliveries).await;
        tracing::Span::current().record("outcome", outcome.as_str());
        tracing::debug!("delivery finished");
        outcome
    }
    .instrument(span)
    .await
}

async fn deliver<S, C, Conn>(
    ctx: &Ctx<C, Conn>,
    mut service: S,
    entry: &Entry,
    job_id: Option<JobId>,
    deliveries: u64,
) -> JobOutcome
where
    S: Service<Job>,
    S::Error: fmt::Display,
    C: Classify<S::Response, S::Error>,
    Conn: ConnectionLike + Clone + Send,
{
    let Some(job_id) = job_id else {
        return dead_letter(
            ctx,
            entry,
            DeadReason::Malformed,
            deliveries,
            "no valid job_id field",
        )
        .await;
    };
    if deliveries > ctx.config.max_deliveries {
        return dead_letter(ctx, entry, DeadReason::MaxDeliveries, deliveries, "").await;
    }
    if deliveries > 1 {
        metrics::redelivered();
    }
    let in_flight = InFlight::enter(&ctx.in_flight, &entry.id);
    let deadline = Deadline::after(ctx.config.job_deadline);
    let payload = Bytes::copy_from_slice(entry.field(b"payload").unwrap_or_default());
    let job = Job::new(entry.id.clone(), job_id, payload, deliveries).with_deadline(deadline);
    let run = deadline.in_scope(async {
        std::future::poll_fn(|cx| service.poll_ready(cx)).await?;
        service.call(job).await
    });
    let Ok(result) = tokio::time::timeout_at(deadline.instant(), run).await else {
        tracing::warn!("job deadline passed; left pending for redelivery");
        metrics::failed();
        return JobOutcome::LeftPending;
    };
    match ctx.classifier.classify(&result) {
        Action::Success => {
            metrics::processed();
            // The acker only stops once every task (and so this sender) is gone.
            if ctx.acks.send(entry.id.clone()).await.is_err() {
                return JobOutcome::LeftPending;
            }
            JobOutcome::Acked
        }
        // NOTE: "in progress" is a handler's dependency still running the same work: wait for
        // it as for a transient failure, never dead-letter it.
        Action::Retry { after } | Action::InProgress { after } => {
            metrics::failed();
            if let Err(e) = &result {
                tracing::info!(error = %e, "transient failure; left pending for redelivery");
            }
            if let Some(after) = after {
                // Out of the refresher's set first, or its next tick would undo the delay.
                drop(in_flight);
                redeliver_after(ctx, &entry.id, after).await;
            }
            JobOutcome::LeftPending
        }
        _ => {
            metrics::failed();
            let error = match &result {
                Err(e) => error_text(e),
                Ok(_) => "the outcome classified as permanent".to_owned(),
            };
            dead_letter(ctx, entry, DeadReason::Permanent, deliveries, &error).await
        }
    }
}

/// How many early take-over times the fetcher remembers.
pub(crate) const MAX_CLAIM_TIMES: usize = 1024;

/// Makes the entry claimable after `after` rather than `claim_idle` (never later than that).
/// Best effort: if Redis does not answer, the entry waits `claim_idle` as usual.
async fn redeliver_after<C, Conn>(ctx: &Ctx<C, Conn>, id: &str, after: Duration)
where
    Conn: ConnectionLike + Clone + Send,
{
    let claim_idle = ctx.config.claim_idle;
    let idle = claim_idle.saturating_sub(after.min(claim_idle));
    match set_idle(ctx, DELAY_SCRIPT, id, idle).await {
        Ok(()) => {
            tracing::debug!(?after, "redelivery held back as asked");
            // A little after the entry's idle time reaches claim_idle.
            let at = tokio::time::Instant::now() + (claim_idle - idle) + Duration::from_millis(5);
            let mut times = ctx.claim_at.lock().unwrap_or_else(PoisonError::into_inner);
            // Bounded: past this many, the regular pass (claim_idle / 2) picks them up.
            if times.len() < MAX_CLAIM_TIMES {
                times.push(Reverse(at));
            }
        }
        Err(e) => tracing::debug!(error = %e, "could not set the redelivery delay"),
    }
}

/// Gives a fetched entry back unrun (its handler was found not ready after the fetch): its
/// delivery count restored and its idle time set to `claim_idle`, so the next claim pass of
/// whichever consumer is ready takes it over. Best effort: if Redis does not answer, the entry
/// waits `claim_idle` with the delivery counted.
pub(crate) async fn give_back<C, Conn>(ctx: &Ctx<C, Conn>, id: &str)
where
    Conn: ConnectionLike + Clone + Send,
{
    match set_idle(ctx, GIVE_BACK_SCRIPT, id, ctx.config.claim_idle).await {
        Ok(()) => tracing::debug!(stream_id = id, "handler not ready: entry given back unrun"),
        Err(e) => tracing::debug!(error = %e, "could not give the entry back"),
    }
}

/// Runs one of the scripts that set a pending entry's idle time (while it is this
/// consumer's), within the command timeout.
async fn set_idle<C, Conn>(
    ctx: &Ctx<C, Conn>,
    script: &str,
    id: &str,
    idle: Duration,
) -> Result<(), String>
where
    Conn: ConnectionLike + Clone + Send,
{
    let idle_ms = u64::try_from(idle.as_millis()).unwrap_or(u64::MAX);
    let script = Script::new(script);
    let mut invocation = script.key(&ctx.config.stream);
    invocation
        .arg(&ctx.config.group)
        .arg(&ctx.config.consumer)
        .arg(id)
        .arg(idle_ms);
    let mut conn = ctx.conn.clone();
    match tokio::time::timeout(
        ctx.config.command_timeout,
        invocation.invoke_async::<i64>(&mut conn),
    )
    .await
    {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("timed out".to_owned()),
    }
}

fn error_text(e: &impl fmt::Display) -> String {
    let mut text = String::new();
    let _ = write!(text, "{e}");
    if text.len() > MAX_ERROR_TEXT {
        let mut end = MAX_ERROR_TEXT;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

async fn dead_letter<C, Conn>(
    ctx: &Ctx<C, Conn>,
    entry: &Entry,
    reason: DeadReason,
    deliveries: u64,
    error: &str,
) -> JobOutcome
where
    Conn: ConnectionLike + Clone + Send,
{
    let config = &ctx.config;
    let names = (
        config.stream.as_str(),
        config.group.as_str(),
        config.dead_letter.as_str(),
    );
    let letter = Letter {
        entry,
        reason,
        deliveries,
        error,
        consumer: &config.consumer,
    };
    match dead_letter::dead_letter(&mut ctx.conn.clone(), names, letter, config.command_timeout)
        .await
    {
        Ok(()) => {
            metrics::dead_lettered(reason.as_str());
            tracing::warn!(reason = reason.as_str(), error, "dead-lettered");
            JobOutcome::DeadLettered
        }
        Err(e) => {
            // Still pending: a later delivery dead-letters it again.
            tracing::warn!(error = %e, "could not dead-letter; left pending");
            JobOutcome::LeftPending
        }
    }
}

/// Waits between the tries of one batch of `XACK`s: 50, 100, 200 ms.
const ACK_AGAIN: Backoff = Backoff::doubling(Duration::from_millis(50), Duration::from_millis(200));

/// Acknowledges in batches: whatever is queued when the previous `XACK` returns goes in the
/// next one. Safe because `XACK` is idempotent and order-free; a lost ack only means a
/// redelivery, which run-once turns into a duplicate.
pub(crate) async fn ack_loop<Conn>(
    mut conn: Conn,
    config: WorkerConfig,
    mut rx: mpsc::Receiver<String>,
    max: usize,
) where
    Conn: ConnectionLike + Send,
{
    let mut batch = Vec::with_capacity(max);
    while rx.recv_many(&mut batch, max).await > 0 {
        let cmd = streams::ack_cmd(&config.stream, &config.group, &batch);
        let mut last = None;
        for attempt in 0..3u32 {
            match streams::query::<_, Value>(&mut conn, &cmd, config.command_timeout).await {
                Ok(_) => {
                    last = None;
                    break;
                }
                Err(e) => last = Some(e),
            }
            tokio::time::sleep(ACK_AGAIN.exponential(attempt + 1)).await;
        }
        if let Some(e) = last {
            tracing::warn!(error = %e, entries = batch.len(), "XACK failed; the entries will be redelivered");
        }
        batch.clear();
    }
}

/// Every third of `claim_idle`, resets the idle time of the entries whose handlers run here,
/// so no other consumer takes them over; a dead worker stops doing it and loses them. With the
/// `metrics` feature it also reports the group's lag (`XINFO GROUPS`) at the same pace.
pub(crate) async fn refresh_loop<C, Conn>(ctx: Arc<Ctx<C, Conn>>)
where
    Conn: ConnectionLike + Clone + Send,
{
    let script = Script::new(REFRESH_SCRIPT);
    let mut tick = tokio::time::interval(ctx.config.refresh_interval());
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut conn = ctx.conn.clone();
    loop {
        tick.tick().await;
        if metrics::GROUP_LAG {
            let (stream, group) = (&ctx.config.stream, &ctx.config.group);
            let timeout = ctx.config.command_timeout;
            if let Ok(Some(lag)) = streams::group_lag(&mut conn, stream, group, timeout).await {
                metrics::group_lag(lag);
            }
        }
        let ids: Vec<String> = ctx
            .in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .cloned()
            .collect();
        if ids.is_empty() {
            continue;
        }
        let mut invocation = script.key(&ctx.config.stream);
        invocation
            .arg(&ctx.config.group)
            .arg(&ctx.config.consumer)
            .arg(&ids);
        let sent = tokio::time::timeout(
            ctx.config.command_timeout,
            invocation.invoke_async::<Vec<String>>(&mut conn),
        )
        .await;
        match sent {
            Ok(Ok(kept)) if kept.len() < ids.len() => {
                let kept: HashSet<&String> = kept.iter().collect();
                let mut set = ctx.in_flight.lock().unwrap_or_else(PoisonError::into_inner);
                for lost in ids.iter().filter(|id| !kept.contains(id)) {
                    // Warned once: it is no longer ours to refresh.
                    set.remove(lost);
                    tracing::warn!(stream_id = %lost, "entry was taken over by another consumer while running here");
                }
            }
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "refreshing in-flight entries failed"),
            Err(_) => tracing::warn!("refreshing in-flight entries timed out"),
        }
    }
}
