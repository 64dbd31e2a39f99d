//! Why an [`HttpSender`](super::HttpSender) did not deliver a message, and what the relay
//! should do about it.

use bytes::Bytes;
use http::StatusCode;
use std::fmt;
use std::time::Duration;
use tower_once_retry::classify::Action;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How much of a provider's error body the message (and so the row's `last_error`) quotes.
const QUOTED_BODY: usize = 512;

/// A message the [`HttpSender`](super::HttpSender) did not deliver. Query with the `is_*`
/// methods; [`action`](Self::action) is the sender's verdict, which the relay's default
/// classifier, [`SendClassifier`](../classify/struct.SendClassifier.html), follows: park it
/// ([`is_permanent`](Self::is_permanent)) or try again, after
/// [`retry_after`](Self::retry_after) if the provider said.
///
/// The client's own error is kept as the [`source`](std::error::Error::source), boxed: the
/// relay must recognise this type whatever client sits below it.
#[derive(Debug)]
pub struct HttpSendError {
    kind: Kind,
    action: Action,
}

#[derive(Debug)]
enum Kind {
    /// No route for the message's topic.
    Unrouted(String),
    /// The dedupe key cannot be a header value.
    InvalidKey,
    /// The provider answered with a status the classifier did not call a success.
    Status { status: StatusCode, body: Bytes },
    /// The client service failed.
    Transport(BoxError),
}

impl HttpSendError {
    /// NOTE: retried, not parked: in a rolling deploy the relays that already know a new
    /// topic send it, and a topic nobody routes is parked after `max_attempts`.
    pub(crate) fn unrouted(topic: &str) -> Self {
        Self {
            kind: Kind::Unrouted(topic.to_owned()),
            action: Action::Retry { after: None },
        }
    }

    /// No attempt can send it: parked.
    pub(crate) fn invalid_key() -> Self {
        Self {
            kind: Kind::InvalidKey,
            action: Action::Stop,
        }
    }

    pub(crate) fn answered(status: StatusCode, body: Bytes, action: Action) -> Self {
        Self {
            kind: Kind::Status { status, body },
            action,
        }
    }

    pub(crate) fn transport(error: BoxError, action: Action) -> Self {
        Self {
            kind: Kind::Transport(error),
            action,
        }
    }

    /// The message's topic has no [`Route`](super::Route). Nothing was sent. Retried (another
    /// relay of a newer deploy may know the topic) and parked after `max_attempts`.
    pub fn is_unrouted(&self) -> bool {
        matches!(self.kind, Kind::Unrouted(_))
    }

    /// The row's dedupe key cannot be sent as a header (it was written without
    /// [`Outbox::enqueue`](crate::Outbox::enqueue), which refuses such keys). Nothing was
    /// sent; parked.
    pub fn is_invalid_key(&self) -> bool {
        matches!(self.kind, Kind::InvalidKey)
    }

    /// The provider answered with a status the sender's classifier did not call a success
    /// (a `503`, a `400`...): [`status`](Self::status) and [`body`](Self::body) say what.
    pub fn is_status(&self) -> bool {
        matches!(self.kind, Kind::Status { .. })
    }

    /// The client service failed (connect, a timeout layer, a retry layer that gave up): the
    /// request may or may not have reached the provider. Its error is the `source()`.
    pub fn is_transport(&self) -> bool {
        matches!(self.kind, Kind::Transport(_))
    }

    /// The sender's verdict: [`Action::Stop`] parks the row, [`Action::Retry`] (or
    /// [`Action::InProgress`]: the provider is still running the same key's request) schedules
    /// another attempt (after the provider's delay when it gave one). [`Action::Success`] only
    /// when the sender's own classifier called a client error a success; the relay then counts
    /// the message as sent.
    pub fn action(&self) -> Action {
        self.action
    }

    /// No attempt can succeed: the relay parks the row for a person.
    pub fn is_permanent(&self) -> bool {
        self.action == Action::Stop
    }

    /// The delay the provider asked for (`Retry-After`), when the failure is worth retrying.
    pub fn retry_after(&self) -> Option<Duration> {
        match self.action {
            Action::Retry { after } | Action::InProgress { after } => after,
            _ => None,
        }
    }

    /// The provider's status, for [`is_status`](Self::is_status) errors.
    pub fn status(&self) -> Option<StatusCode> {
        match &self.kind {
            Kind::Status { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// The start of the provider's response body (up to 64 KiB), for
    /// [`is_status`](Self::is_status) errors.
    pub fn body(&self) -> Option<&Bytes> {
        match &self.kind {
            Kind::Status { body, .. } => Some(body),
            _ => None,
        }
    }

    /// The topic that has no route, for [`is_unrouted`](Self::is_unrouted) errors.
    pub fn topic(&self) -> Option<&str> {
        match &self.kind {
            Kind::Unrouted(topic) => Some(topic),
            _ => None,
        }
    }
}

impl fmt::Display for HttpSendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Unrouted(topic) => write!(f, "no HTTP route for outbox topic {topic:?}"),
            Kind::InvalidKey => {
                f.write_str("the dedupe key cannot be sent as an Idempotency-Key header")
            }
            Kind::Status { status, body } => {
                write!(f, "the provider answered {status}")?;
                if let Some(after) = self.retry_after() {
                    write!(f, " (retry after {after:?})")?;
                }
                // What the provider said is what a person reading a parked row needs.
                let quoted = &body[..body.len().min(QUOTED_BODY)];
                let text = String::from_utf8_lossy(quoted);
                let text = text.trim();
                if !text.is_empty() {
                    write!(f, ": {text}")?;
                }
                Ok(())
            }
            // The cause is the useful part ("connection refused"): said here too.
            Kind::Transport(e) => write!(f, "HTTP request failed: {e}"),
        }
    }
}

impl std::error::Error for HttpSendError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            Kind::Transport(e) => Some(&**e),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    #[test]
    fn queries_and_texts_say_what_happened() {
        let unrouted = HttpSendError::unrouted("sms");
        assert!(unrouted.is_unrouted() && !unrouted.is_permanent());
        assert_eq!(unrouted.topic(), Some("sms"));
        assert_eq!(
            unrouted.to_string(),
            r#"no HTTP route for outbox topic "sms""#
        );

        let after = Some(Duration::from_secs(2));
        let busy = HttpSendError::answered(
            StatusCode::SERVICE_UNAVAILABLE,
            Bytes::from_static(b"  down for maintenance\n"),
            Action::Retry { after },
        );
        assert!(busy.is_status() && !busy.is_permanent());
        assert_eq!(busy.retry_after(), after);
        assert_eq!(busy.status(), Some(StatusCode::SERVICE_UNAVAILABLE));
        assert_eq!(
            busy.to_string(),
            "the provider answered 503 Service Unavailable (retry after 2s): down for maintenance"
        );

        let long = Bytes::from(vec![b'x'; 4096]);
        let refused = HttpSendError::answered(StatusCode::BAD_REQUEST, long, Action::Stop);
        assert!(refused.is_permanent() && refused.retry_after().is_none());
        assert!(refused.to_string().len() < QUOTED_BODY + 64);
        assert_eq!(refused.body().map(Bytes::len), Some(4096));
        assert!(refused.source().is_none());

        let io = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let transport = HttpSendError::transport(io.into(), Action::Retry { after: None });
        assert!(transport.is_transport());
        assert!(transport.to_string().starts_with("HTTP request failed: "));
        assert!(transport.source().is_some());

        assert!(HttpSendError::invalid_key().is_permanent());
    }
}
