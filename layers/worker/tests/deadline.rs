//! The per-delivery deadline (worker crate docs: a `Deadline` in scope for every poll of the
//! handler, and on the job; retry crate docs: the deadline and the
//! attempt's mark travel with the worker's `Job`), with real `redis-server` processes: layers
//! inside the handler stack are bounded by it, across tasks and channels too.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::{config, eventually, handler, manager, pending, start, xadd, Log};
use tower::{Layer, ServiceExt};
use tower_once_retry::backoff::Backoff;
use tower_once_retry::RetryLayer;
use tower_once_test_support::redis::RedisServer;
use tower_once_worker::{Job, JobError, JobId, Producer, Worker, WorkerConfig};

/// The delivery's deadline is in scope for the handler: a `TimeoutLayer` inside with a 10 s
/// limit cuts a hung call at the 300 ms `job_deadline`, the error says it was the deadline,
/// and the entry stays pending.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_layer_inside_is_capped_by_the_job_deadline() {
    let server = RedisServer::start();
    let mut conn = manager(&server.url()).await;
    let hung = tower_once_timeout::TimeoutLayer::new(Duration::from_secs(10)).layer(
        tower::service_fn(|_job: Job| async {
            tokio::time::sleep(Duration::from_secs(60)).await;
            Ok::<_, JobError>(())
        }),
    );
    let cut_by_deadline = Arc::new(Mutex::new(None));
    let seen = cut_by_deadline.clone();
    let svc = tower::service_fn(move |job: Job| {
        let (hung, seen) = (hung.clone(), seen.clone());
        async move {
            let err = hung.oneshot(job).await.unwrap_err();
            *seen.lock().unwrap() = Some(err.elapsed().is_some_and(|e| e.is_deadline()));
            Err::<(), _>(JobError::transient(err.to_string()))
        }
    });
    xadd(&mut conn, "jobs", "hung", "{}").await;
    let config = config("jobs", "w")
        .job_deadline(Duration::from_millis(300))
        .claim_idle(Duration::from_secs(60));
    let worker = start!(Worker::connect(&server.url(), config, svc).unwrap());
    eventually("cut", || async {
        cut_by_deadline.lock().unwrap().is_some()
    })
    .await;
    let report = worker.stop().await;
    assert_eq!(
        *cut_by_deadline.lock().unwrap(),
        Some(true),
        "the deadline, not the 10 s limit"
    );
    assert_eq!(report.left_pending, 1);
    assert_eq!(pending(&mut conn, "jobs").await, 1);
}

/// The deadline and the attempt's mark travel with the worker's `Job` across tasks and channels
/// (retry crate docs; worker crate docs: a per-delivery deadline "in
/// scope for every poll of the handler, and on the job"): a real `Worker` whose handler stack is a
/// `RetryLayer` (10 attempts, a retry every 300 ms, its own 30 s deadline), then a channel to a
/// pool task that runs each job on a spawned task of its own, then another `RetryLayer` and a
/// `TimeoutLayer` over a handler that always fails. With a 1 s `job_deadline` the outer layer makes
/// at most 4 attempts (at 0, 0.3, 0.6, 0.9 s) and the inner one defers to it: at most 4 handler
/// calls for the delivery, where a lost deadline would give 10 and a lost mark 4 × 4.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_job_deadline_and_attempt_mark_cross_a_channel_and_a_task_in_the_workers_stack() {
    use tower_once_retry::backoff::Jitter;
    use tower_once_timeout::TimeoutLayer;
    let server = RedisServer::start();
    let conn = manager(&server.url()).await;
    let log = Log::default();
    let failing = handler(&log, |_| Err(JobError::transient("upstream 503")));
    let inner = RetryLayer::new()
        .no_budget()
        .backoff(Backoff::new(Duration::from_millis(1), 1.0, Duration::from_millis(1)).unwrap())
        .layer(TimeoutLayer::new(Duration::from_secs(5)).layer(failing));
    // A pool: jobs go over a channel to a task that runs each on a task of its own.
    type Reply = tokio::sync::oneshot::Sender<Result<(), String>>;
    let (queue, mut jobs) = tokio::sync::mpsc::channel::<(Job, Reply)>(16);
    tokio::spawn(async move {
        while let Some((job, reply)) = jobs.recv().await {
            let inner = inner.clone();
            tokio::spawn(async move {
                let outcome = inner.oneshot(job).await.map_err(|e| e.to_string());
                let _ = reply.send(outcome);
            });
        }
    });
    let pooled = tower::service_fn(move |job: Job| {
        let queue = queue.clone();
        async move {
            let (reply, answer) = tokio::sync::oneshot::channel();
            queue
                .send((job, reply))
                .await
                .map_err(|_| JobError::transient("pool gone"))?;
            answer
                .await
                .map_err(|_| JobError::transient("pool dropped the job"))?
                .map_err(JobError::transient)
        }
    });
    let svc = RetryLayer::new()
        .no_budget()
        .max_attempts(10)
        .backoff(
            Backoff::new(Duration::from_millis(300), 1.0, Duration::from_millis(300))
                .unwrap()
                .jitter(Jitter::None),
        )
        .layer(pooled);
    Producer::new(conn.clone(), "jobs")
        .enqueue(&JobId::new("deadline-1").unwrap(), "{}")
        .await
        .unwrap();
    let config = WorkerConfig::new("jobs", "workers")
        .consumer("w1")
        .claim_idle(Duration::from_secs(60))
        .job_deadline(Duration::from_secs(1))
        .shutdown_grace(Duration::from_secs(10));
    let worker = start!(Worker::connect(&server.url(), config, svc).unwrap());
    eventually("the delivery started", || async {
        log.calls("deadline-1") > 0
    })
    .await;
    // Long after a deadline-blind stack would have made all its attempts (2.7 s).
    tokio::time::sleep(Duration::from_secs(4)).await;
    let report = worker.stop().await;
    let calls = log.calls("deadline-1");
    assert!(
        (1..=4).contains(&calls),
        "{calls} handler calls for one delivery with a 1 s deadline"
    );
    assert_eq!(log.deliveries("deadline-1"), vec![1; calls], "one delivery");
    assert_eq!(report.acked, 0);
}
