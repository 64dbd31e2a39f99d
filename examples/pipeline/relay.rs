//! The relay: sends outbox rows to the mailer with their dedupe key as `Idempotency-Key`.

use crate::args::Args;
use crate::db;
use http::header::{HeaderValue, CONTENT_TYPE};
use http::{Response, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::future::Future;
use std::time::Duration;
use tower::ServiceBuilder;
use tower_once::outbox::http::{Delivered, HttpSendError, HttpSender, Route};
use tower_once::outbox::{OutboxRelay, RelayConfig};
use tower_once::retry::backoff::{Backoff, Jitter};
use tower_once::retry::classify::{Action, Classify, HttpClassifier};
use tower_once::timeout::http::HttpTimeoutLayer;
use tower_once::worker::BoxError;

pub(crate) async fn run(
    args: &Args,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), BoxError> {
    let (_, outbox) = db::connect(&args.postgres, true).await?;
    let client = ServiceBuilder::new()
        .layer(HttpTimeoutLayer::new(Duration::from_secs(10)))
        .service(Client::builder(TokioExecutor::new()).build_http());
    let emails = Route::post(format!("{}/v1/emails", args.mailer).parse()?)
        .header(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    let linger = args.linger;
    let sender = ServiceBuilder::new()
        // The crash window a test kills the relay in: sent, not yet recorded.
        .and_then(move |delivered: Delivered| async move {
            tokio::time::sleep(linger).await;
            Ok::<_, HttpSendError>(delivered)
        })
        .service(
            HttpSender::new(client)
                .route("email", emails)
                .classify(MailerClassifier),
        );
    let lease = args.claim_idle.max(Duration::from_secs(1));
    let config = RelayConfig::new()
        .lease(lease)
        .send_timeout(lease.mul_f64(0.8))
        .poll_interval(args.poll.max(Duration::from_millis(10)))
        // 1 to 2 s after the first failure (equal jitter), doubling to a minute: a provider that
        // is down is not hammered, and one that is back gets the row on the next pass.
        .backoff(
            Backoff::new(Duration::from_secs(2), 2.0, Duration::from_secs(60))?
                .jitter(Jitter::Equal),
        );
    // The sender classifies the mailer's answers itself: the relay's default follows it.
    let relay = OutboxRelay::new(outbox, config, sender)?;
    tracing::info!("relay starting");
    let report = relay.run(shutdown).await;
    tracing::info!(?report, "relay stopped");
    Ok(())
}

/// HTTP's usual classes, except that `409` (another relay is sending the same key right now)
/// is worth another attempt, not a parked row.
#[derive(Clone, Copy)]
struct MailerClassifier;

impl<B, E> Classify<Response<B>, E> for MailerClassifier {
    fn classify(&self, outcome: &Result<Response<B>, E>) -> Action {
        match outcome {
            Ok(r) if r.status() == StatusCode::CONFLICT => Action::Retry { after: None },
            other => HttpClassifier.classify(other),
        }
    }
}
