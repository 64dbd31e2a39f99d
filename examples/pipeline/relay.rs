//! The relay: sends outbox rows to the mailer with their dedupe key as `Idempotency-Key`.

use crate::args::Args;
use crate::db;
use bytes::Bytes;
use http::{Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::future::Future;
use std::time::Duration;
use tower::{ServiceBuilder, ServiceExt};
use tower_once::outbox::{OutboxMessage, OutboxRelay, RelayConfig};
use tower_once::retry::backoff::{Backoff, Jitter};
use tower_once::retry::classify::{Action, Classify, HttpClassifier};
use tower_once::timeout::TimeoutLayer;
use tower_once::worker::BoxError;

pub(crate) async fn run(
    args: &Args,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), BoxError> {
    let (_, outbox) = db::connect(&args.postgres, true).await?;
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let url = format!("{}/v1/emails", args.mailer);
    let linger = args.linger;
    let sender = ServiceBuilder::new()
        .layer(TimeoutLayer::new(Duration::from_secs(10)))
        .service(tower::service_fn(move |message: OutboxMessage| {
            let client = client.clone();
            let request = message.http_request(url.as_str());
            async move {
                let mut request = request?.map(Full::new);
                request.headers_mut().insert(
                    "content-type",
                    http::HeaderValue::from_static("application/json"),
                );
                let response = client.oneshot(request).await?;
                let (parts, body) = response.into_parts();
                let _ = body.collect().await?;
                // The crash window a test kills the relay in: sent, not yet recorded.
                tokio::time::sleep(linger).await;
                Ok::<_, BoxError>(Response::from_parts(parts, ()))
            }
        }));
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
    let relay = OutboxRelay::new(outbox, config, sender)?.classify(MailerClassifier);
    tracing::info!("relay starting");
    let report = relay.run(shutdown).await;
    tracing::info!(?report, "relay stopped");
    Ok(())
}

/// HTTP's usual classes, except that `409` (another relay is sending the same key right now)
/// is worth another attempt, not a parked row.
#[derive(Clone, Copy)]
struct MailerClassifier;

impl<E> Classify<Response<()>, E> for MailerClassifier {
    fn classify(&self, outcome: &Result<Response<()>, E>) -> Action {
        match outcome {
            Ok(r) if r.status() == StatusCode::CONFLICT => Action::Retry { after: None },
            other => HttpClassifier.classify(other),
        }
    }
}
