//! What goes into the outbox and what comes out of it.

use crate::error::OutboxError;
use bytes::Bytes;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tower_once_core::IDEMPOTENCY_KEY;
use tower_once_timeout::Carrier;

/// The longest dedupe key, as for an `Idempotency-Key` (Stripe allows 255 characters too).
pub const MAX_KEY_LEN: usize = 255;
/// The longest topic.
pub const MAX_TOPIC_LEN: usize = 255;
/// The largest payload [`Outbox::enqueue`](crate::Outbox::enqueue) accepts by default: an
/// outbox row is a message, not a file.
pub const DEFAULT_MAX_PAYLOAD: usize = 1024 * 1024;

/// The dedupe key leaves as an HTTP header, so it must be one: 1 to 255 visible ASCII
/// characters (`!` to `~`).
pub(crate) fn check(
    topic: &str,
    dedupe_key: &str,
    payload: &[u8],
    max: usize,
) -> Result<(), OutboxError> {
    if dedupe_key.is_empty() || dedupe_key.len() > MAX_KEY_LEN {
        return Err(OutboxError::invalid("dedupe key must be 1 to 255 bytes"));
    }
    if !dedupe_key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(OutboxError::invalid(
            "dedupe key must be visible ASCII (it is sent as the Idempotency-Key header)",
        ));
    }
    if topic.is_empty() || topic.len() > MAX_TOPIC_LEN || topic.chars().any(char::is_control) {
        return Err(OutboxError::invalid(
            "topic must be 1 to 255 bytes without control characters",
        ));
    }
    if payload.len() > max {
        return Err(OutboxError::invalid(
            "payload is over the outbox's max_payload",
        ));
    }
    Ok(())
}

/// What [`Outbox::enqueue`](crate::Outbox::enqueue) did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Enqueued {
    /// A new row, with its id; it is sent once your transaction commits.
    New(i64),
    /// The same dedupe key, topic and payload are already in the outbox (row id): nothing was
    /// written, and the message is sent once.
    Duplicate(i64),
}

impl Enqueued {
    /// The row id.
    pub fn id(&self) -> i64 {
        match *self {
            Self::New(id) | Self::Duplicate(id) => id,
        }
    }

    /// `true` when the row was already there.
    pub fn is_duplicate(&self) -> bool {
        matches!(self, Self::Duplicate(_))
    }
}

/// A message the relay is sending: what the sender service receives.
///
/// It carries the send's [`Deadline`](tower_once_timeout::Deadline) in its
/// [`extensions`](Self::extensions) (it is a [`Carrier`]), so a `RetryLayer` or `TimeoutLayer`
/// in the sender sees it even behind a `Buffer` or on another task.
#[derive(Debug, Clone)]
pub struct OutboxMessage {
    pub(crate) id: i64,
    pub(crate) topic: String,
    pub(crate) dedupe_key: String,
    pub(crate) payload: Bytes,
    pub(crate) attempt: u32,
    pub(crate) created_at: SystemTime,
    pub(crate) extensions: http::Extensions,
}

impl Carrier for OutboxMessage {
    fn extensions(&self) -> Option<&http::Extensions> {
        Some(&self.extensions)
    }

    fn extensions_mut(&mut self) -> Option<&mut http::Extensions> {
        Some(&mut self.extensions)
    }
}

impl OutboxMessage {
    /// The row id.
    pub fn id(&self) -> i64 {
        self.id
    }

    /// The topic it was enqueued with: route on it.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// The dedupe key: give it to the provider as its idempotency key, so that a message sent
    /// twice (a relay that dies after sending, before recording it) has its effect once.
    pub fn dedupe_key(&self) -> &str {
        &self.dedupe_key
    }

    /// The payload.
    pub fn payload(&self) -> &Bytes {
        &self.payload
    }

    /// Which attempt this is, from 1: earlier failed sends, plus sends whose relay died.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// When it was enqueued (the database's clock).
    pub fn created_at(&self) -> SystemTime {
        self.created_at
    }

    /// What travels with the message to the sender (the relay puts the send's deadline here).
    pub fn extensions(&self) -> &http::Extensions {
        &self.extensions
    }

    /// What travels with the message to the sender, mutably.
    pub fn extensions_mut(&mut self) -> &mut http::Extensions {
        &mut self.extensions
    }

    /// A `POST` of the payload to `uri` with the dedupe key as its `Idempotency-Key`, for HTTP
    /// senders, carrying the message's extensions (its deadline). Set the `Content-Type` your
    /// provider expects on the result.
    ///
    /// ```no_run
    /// # fn message() -> tower_once_outbox::OutboxMessage { unimplemented!() }
    /// # fn f() -> Result<(), http::Error> {
    /// let request = message().http_request("http://mailer.internal/v1/send")?;
    /// assert_eq!(request.headers()["idempotency-key"], message().dedupe_key());
    /// # Ok(()) }
    /// ```
    pub fn http_request<U>(&self, uri: U) -> Result<http::Request<Bytes>, http::Error>
    where
        http::Uri: TryFrom<U>,
        <http::Uri as TryFrom<U>>::Error: Into<http::Error>,
    {
        let mut request = http::Request::post(uri)
            .header(IDEMPOTENCY_KEY, self.dedupe_key.as_str())
            .body(self.payload.clone())?;
        *request.extensions_mut() = self.extensions.clone();
        Ok(request)
    }
}

/// A row the relay gave up on, waiting for a person: [`Outbox::retry_parked`](crate::Outbox::retry_parked)
/// sends it again.
#[derive(Debug, Clone)]
pub struct ParkedMessage {
    /// The row id.
    pub id: i64,
    /// The topic.
    pub topic: String,
    /// The dedupe key.
    pub dedupe_key: String,
    /// The payload.
    pub payload: Bytes,
    /// Failed attempts.
    pub attempts: u32,
    /// The last attempt's error text.
    pub last_error: Option<String>,
    /// When it was enqueued.
    pub created_at: SystemTime,
    /// When the relay parked it.
    pub parked_at: SystemTime,
}

/// Row counts by state, from [`Outbox::stats`](crate::Outbox::stats).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OutboxStats {
    /// Not yet sent and not parked (due now, backing off, or being sent).
    pub pending: u64,
    /// Of those, held by a relay's lease right now.
    pub leased: u64,
    /// Parked for a person.
    pub parked: u64,
    /// Sent and not yet purged.
    pub sent: u64,
}

pub(crate) fn time_from_millis(millis: i64) -> SystemTime {
    let millis = u64::try_from(millis).unwrap_or(0);
    UNIX_EPOCH
        .checked_add(Duration::from_millis(millis))
        .unwrap_or(UNIX_EPOCH)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
    use std::sync::Arc;
    use tower::{Layer, ServiceExt};
    use tower_once_retry::RetryLayer;
    use tower_once_timeout::{Deadline, TimeoutLayer};

    fn message() -> OutboxMessage {
        OutboxMessage {
            id: 1,
            topic: "email".to_owned(),
            dedupe_key: "order-1:email".to_owned(),
            payload: Bytes::from_static(b"{}"),
            attempt: 1,
            created_at: UNIX_EPOCH,
            extensions: http::Extensions::new(),
        }
    }

    /// A message carries the relay's send deadline (it is a `Carrier`), as the relay attaches
    /// it: a sender stack behind a `Buffer`, reached from another task, ends at it, and an
    /// inner retry layer there defers to the outer one.
    #[tokio::test(start_paused = true)]
    async fn a_messages_deadline_and_attempt_mark_cross_a_buffer_and_a_task() {
        let calls = Arc::new(AtomicU32::new(0));
        let counter = calls.clone();
        let hanging = tower::service_fn(move |_m: OutboxMessage| {
            counter.fetch_add(1, SeqCst);
            std::future::pending::<Result<(), std::io::Error>>()
        });
        let stack = RetryLayer::new()
            .no_budget()
            .layer(TimeoutLayer::new(Duration::from_secs(30)).layer(hanging));
        let buffered = tower::buffer::Buffer::new(stack, 4);
        let mut sent = message();
        Deadline::after(Duration::from_secs(2)).attach(&mut sent);
        let started = tokio::time::Instant::now();
        assert!(tokio::spawn(buffered.oneshot(sent)).await.unwrap().is_err());
        assert_eq!(calls.load(SeqCst), 1, "no retry after the deadline");
        assert_eq!(started.elapsed(), Duration::from_secs(2));

        let calls = Arc::new(AtomicU32::new(0));
        let counter = calls.clone();
        let failing = tower::service_fn(move |_m: OutboxMessage| {
            counter.fetch_add(1, SeqCst);
            async { Err::<(), _>(std::io::Error::other("503")) }
        });
        let inner = RetryLayer::new().no_budget().layer(failing);
        let spawning = tower::service_fn(move |m: OutboxMessage| {
            let inner = inner.clone();
            async move { tokio::spawn(inner.oneshot(m)).await.unwrap() }
        });
        let outer = RetryLayer::new()
            .no_budget()
            .max_attempts(3)
            .layer(spawning);
        let err = outer.oneshot(message()).await.unwrap_err();
        assert_eq!(err.attempts(), 3);
        assert_eq!(calls.load(SeqCst), 3, "3 attempts, not 3 x 4");
    }

    #[test]
    fn the_http_request_of_a_message_carries_its_deadline() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        rt.block_on(async {
            let mut m = message();
            let deadline = Deadline::after(Duration::from_secs(2));
            deadline.attach(&mut m);
            let request = m.http_request("http://mailer/send").unwrap();
            assert_eq!(Deadline::carried(&request), Some(deadline));
            assert_eq!(request.headers()["idempotency-key"], "order-1:email");
        });
    }

    #[test]
    fn keys_that_cannot_be_a_header_are_refused() {
        let ok = |k: &str| check("mail", k, b"{}", 16).is_ok();
        assert!(ok("job-1:mail"));
        assert!(!ok(""));
        assert!(!ok("has space"));
        assert!(!ok("line\nbreak"));
        assert!(!ok("ünïcode"));
        assert!(!ok(&"k".repeat(256)));
        assert!(ok(&"k".repeat(255)));
        assert!(check("", "k", b"", 16).is_err());
        assert!(check("a\u{0}b", "k", b"", 16).is_err());
        assert!(check("mail", "k", &[0; 17], 16).is_err());
    }
}
