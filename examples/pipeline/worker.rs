//! The worker: reads `jobs:summaries`, calls the model through `RetryLayer` + `TimeoutLayer`,
//! and writes the summary, its email (an outbox row) and its run-once record in one
//! transaction: `RunOnceLayer` on the Postgres store, completed by the handler itself.

use crate::api::STREAM;
use crate::args::Args;
use crate::db;
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde::Deserialize;
use serde_json::json;
use std::future::Future;
use std::time::Duration;
use tower::util::BoxCloneService;
use tower::{Layer, ServiceBuilder, ServiceExt};
use tower_once::idempotency::store::postgres::PostgresStore;
use tower_once::idempotency::Claim;
use tower_once::outbox::sqlx::{self, PgPool};
use tower_once::outbox::Outbox;
use tower_once::retry::backoff::Backoff;
use tower_once::retry::classify::HttpClassifier;
use tower_once::retry::RetryLayer;
use tower_once::timeout::http::HttpTimeoutLayer;
use tower_once::worker::{
    BoxError, Job, JobError, RunOnceLayer, RunOnceOutcome, Worker, WorkerConfig,
};

/// The model as a service: text in, status and body out.
type Model = BoxCloneService<(String, String), (StatusCode, Bytes), BoxError>;

#[derive(Clone)]
struct Handler {
    pool: PgPool,
    outbox: Outbox,
    model: Model,
    linger: Duration,
}

#[derive(Deserialize)]
struct Payload {
    #[serde(default)]
    tenant: String,
    text: String,
    notify: String,
}

pub(crate) async fn run(
    args: &Args,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), BoxError> {
    let (pool, outbox) = db::connect(&args.postgres, true).await?;
    let handler = Handler {
        pool,
        outbox,
        model: model_client(args)?,
        linger: args.linger,
    };
    // The run-once records live beside the summaries, so the handler commits its record with
    // them. Half of claim_idle: a crashed delivery's claim has expired by the time its entry
    // is taken over.
    let store = PostgresStore::new(handler.pool.clone()).table("job_runs")?;
    store.migrate().await?;
    let run_once = RunOnceLayer::new(store)
        .lease(args.claim_idle / 2)
        .layer(tower::service_fn(move |job: Job| {
            handle(handler.clone(), job)
        }));
    let service = tower::service_fn(move |job: Job| {
        let (job_id, deliveries) = (job.job_id().as_str().to_owned(), job.deliveries());
        let run = run_once.clone().oneshot(job);
        async move {
            match run.await {
                // Done (or lost) before, in the handler: its line is printed there.
                Ok(RunOnceOutcome::Done(())) => Ok(()),
                Ok(_) => finish(&job_id, "duplicate", deliveries, Duration::ZERO)
                    .await
                    .map_err(BoxError::from),
                Err(error) => Err(BoxError::from(error)),
            }
        }
    });
    let config = WorkerConfig::new(STREAM, "workers")
        .claim_idle(args.claim_idle)
        .max_deliveries(args.max_deliveries)
        .job_deadline(args.job_deadline);
    tracing::info!(consumer = config.consumer_name(), "worker starting");
    let worker = Worker::connect(&args.redis, config, service)?;
    let report = worker.run(shutdown).await;
    tracing::info!(?report, "worker stopped");
    Ok(())
}

/// `POST {model}/v1/summarize`, each attempt capped by `--model-timeout-ms`, up to 4 attempts
/// (the model's `Retry-After` honoured), all within the delivery's deadline.
fn model_client(args: &Args) -> Result<Model, BoxError> {
    let backoff = Backoff::new(Duration::from_millis(200), 2.0, Duration::from_secs(2))?;
    let retry = RetryLayer::new()
        .max_attempts(4)
        .backoff(backoff)
        .classify(HttpClassifier)
        .into_http();
    let client = ServiceBuilder::new()
        .layer(retry)
        .layer(HttpTimeoutLayer::new(args.model_timeout).cover_body(true))
        .service(Client::builder(TokioExecutor::new()).build_http());
    let url = format!("{}/v1/summarize", args.model);
    let model = tower::service_fn(move |(job_id, text): (String, String)| {
        let client = client.clone();
        let url = url.clone();
        async move {
            let request = Request::post(url)
                .header("content-type", "application/json")
                // A key makes the POST retryable: the model may see it more than once.
                .header("idempotency-key", format!("{job_id}:model"))
                .body(Full::new(Bytes::from(json!({ "text": text }).to_string())))?;
            let response = client.oneshot(request).await?;
            let status = response.status();
            let body = response.into_body().collect().await?.to_bytes();
            Ok::<_, BoxError>((status, body))
        }
    });
    Ok(BoxCloneService::new(model))
}

async fn handle(h: Handler, job: Job) -> Result<(), JobError> {
    let job_id = job.job_id().as_str().to_owned();
    let payload: Payload = serde_json::from_slice(job.payload()).map_err(JobError::permanent)?;
    let email_key = email_key(&job_id);
    // Checked before the model is paid for: what can never be stored is dead-lettered now.
    if payload.text.contains('\0') || payload.notify.contains('\0') || payload.tenant.contains('\0')
    {
        return Err(JobError::permanent(
            "payload holds NUL, which Postgres text cannot store",
        ));
    }
    // RunOnceLayer claimed the job id (a job done before never reaches here).
    let claim = job
        .extensions()
        .get::<Claim<PostgresStore>>()
        .cloned()
        .ok_or_else(|| {
            JobError::permanent("no run-once claim: the handler runs under RunOnceLayer")
        })?;
    let summary = summarize(h.model, &job_id, &payload.text).await?;

    let mut tx = h.pool.begin().await.map_err(JobError::transient)?;
    // First, fenced by the claim: a worker paused past its lease (whose job another worker
    // took over) stops here, and its transaction rolls back. The entry stays pending for the
    // delivery that holds the job now.
    if let Err(error) = claim.complete_in(&mut tx).await {
        if error.is_lost() {
            println!(
                "{}",
                json!({ "job_id": job_id, "outcome": "lost", "deliveries": job.deliveries() })
            );
        }
        return Err(JobError::transient(error));
    }
    sqlx::query("INSERT INTO summaries (job_id, tenant, summary, notify) VALUES ($1, $2, $3, $4)")
        .bind(&job_id)
        .bind(&payload.tenant)
        .bind(&summary)
        .bind(&payload.notify)
        .execute(&mut *tx)
        .await
        .map_err(db_error)?;
    let email = json!({ "job_id": job_id, "to": payload.notify, "summary": summary });
    h.outbox
        .enqueue(&mut tx, "email", &email_key, email.to_string())
        .await
        .map_err(|e| {
            if e.is_database() {
                JobError::transient(e)
            } else {
                // Invalid, or the key reused for another message: no redelivery changes that.
                JobError::permanent(e)
            }
        })?;
    tx.commit().await.map_err(JobError::transient)?;
    finish(&job_id, "done", job.deliveries(), h.linger).await
}

/// `<job_id>:email`, or for a job id too long for that to be a dedupe key (up to 255 bytes),
/// the same built on the job id's UUID v5: stable, so a redelivery enqueues the same key.
fn email_key(job_id: &str) -> String {
    let key = format!("{job_id}:email");
    if key.len() <= tower_once::outbox::MAX_KEY_LEN {
        return key;
    }
    let uuid = uuid::Uuid::new_v5(&tower_once::worker::JOB_ID_NAMESPACE, job_id.as_bytes());
    format!("{}:email", uuid.hyphenated())
}

/// Postgres's data exceptions (SQLSTATE class 22: a value it cannot store) are permanent; any
/// other database error (connection, deadlock, shutdown) is worth a redelivery.
fn db_error(e: sqlx::Error) -> JobError {
    let data = e
        .as_database_error()
        .and_then(|d| d.code())
        .is_some_and(|code| code.starts_with("22"));
    if data {
        JobError::permanent(e)
    } else {
        JobError::transient(e)
    }
}

/// The model's answer as a summary, or an error the worker classifies: a 4xx other than
/// 408/429 is permanent (dead-lettered now), anything else transient (redelivered).
async fn summarize(model: Model, job_id: &str, text: &str) -> Result<String, JobError> {
    let (status, body) = model
        .oneshot((job_id.to_owned(), text.to_owned()))
        .await
        .map_err(JobError::transient)?;
    if status.is_success() {
        #[derive(Deserialize)]
        struct Answer {
            summary: String,
        }
        let answer: Answer = serde_json::from_slice(&body).map_err(JobError::transient)?;
        return Ok(answer.summary);
    }
    let error = format!("model answered {status}");
    if status.is_client_error()
        && status != StatusCode::REQUEST_TIMEOUT
        && status != StatusCode::TOO_MANY_REQUESTS
    {
        Err(JobError::permanent(error))
    } else {
        Err(JobError::transient(error))
    }
}

/// One line per finished delivery on stdout, for people and tests; then the crash window.
async fn finish(
    job_id: &str,
    outcome: &str,
    deliveries: u64,
    linger: Duration,
) -> Result<(), JobError> {
    println!(
        "{}",
        json!({ "job_id": job_id, "outcome": outcome, "deliveries": deliveries })
    );
    tracing::info!(job_id, outcome, deliveries, "job finished");
    tokio::time::sleep(linger).await;
    Ok(())
}
