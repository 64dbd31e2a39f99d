//! One round of load: connections (or script callers) that send back to back until the round
//! has passed since they all started.

use super::{request, Counts};
use crate::rows::Row;
use axum::body::Bytes;
use http::{HeaderValue, StatusCode};
use http_body_util::BodyExt;
use hyper_util::rt::TokioIo;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::TcpStream;
use tokio::sync::Barrier;
use tower_once::idempotency::store::redis::redis::{aio::ConnectionManager, Script, Value};
use tower_once::idempotency::IDEMPOTENT_REPLAYED;

/// When a round starts (every task and the timer at one barrier) and how long it lasts.
#[derive(Clone, Debug)]
pub(crate) struct Round {
    pub(crate) start: Arc<Barrier>,
    pub(crate) length: Duration,
}

impl Round {
    /// Waits for every other task, then answers when this round ends.
    async fn begin(&self) -> Instant {
        self.start.wait().await;
        Instant::now() + self.length
    }
}

/// What every connection of an HTTP row shares.
#[derive(Clone, Debug)]
pub(crate) struct HttpTarget {
    pub(crate) addr: SocketAddr,
    pub(crate) body: Bytes,
    /// The keys completed before the first round, which replay rows cycle over.
    pub(crate) replay_keys: Arc<Vec<HeaderValue>>,
}

/// What every direct caller of the claim script shares.
#[derive(Clone)]
pub(crate) struct ScriptTarget {
    pub(crate) script: Arc<Script>,
    pub(crate) connection: ConnectionManager,
    /// The Redis keys of the completed replay records.
    pub(crate) keys: Arc<Vec<String>>,
}

/// One keep-alive connection sending `row`'s requests back to back for one round. Fresh rows
/// send `id-n` keys, replay rows cycle over the replay keys.
pub(crate) async fn http_connection(
    target: HttpTarget,
    row: &'static Row,
    id: String,
    round: Round,
) -> Counts {
    let stream = TcpStream::connect(target.addr)
        .await
        .expect("connect to the server");
    stream.set_nodelay(true).expect("TCP_NODELAY");
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("HTTP/1 handshake");
    tokio::spawn(connection);
    let host =
        HeaderValue::from_str(&target.addr.to_string()).expect("an address is a valid header");
    let mut counts = Counts::default();
    let end = round.begin().await;
    let mut n = 0usize;
    while Instant::now() < end {
        let key = if row.replays() {
            target.replay_keys[n % target.replay_keys.len()].clone()
        } else {
            HeaderValue::from_str(&format!("{id}-{n}")).expect("a valid key")
        };
        n += 1;
        let request = request(host.clone(), row.path(), key, target.body.clone());
        if sender.ready().await.is_err() {
            counts.unexpected += 1;
            break;
        }
        let Ok(response) = sender.send_request(request).await else {
            counts.unexpected += 1;
            break;
        };
        let expected = response.status() == StatusCode::CREATED
            && response.headers().contains_key(IDEMPOTENT_REPLAYED) == row.replays();
        match response.into_body().collect().await {
            Ok(_) if expected => counts.ok += 1,
            Ok(_) => counts.unexpected += 1,
            Err(_) => {
                counts.unexpected += 1;
                break;
            }
        }
    }
    counts
}

/// One caller sending the claim script on completed records for one round.
pub(crate) async fn script_caller(target: ScriptTarget, round: Round) -> Counts {
    let ScriptTarget {
        script,
        mut connection,
        keys,
    } = target;
    let mut counts = Counts::default();
    let end = round.begin().await;
    let mut n = 0usize;
    while Instant::now() < end {
        let key = &keys[n % keys.len()];
        n += 1;
        // The arguments the store sends: a 16-byte token, a 32-byte fingerprint, the lease.
        let reply: Result<Value, _> = script
            .key(key)
            .arg(&[8u8; 16][..])
            .arg(&[1u8; 32][..])
            .arg(10_000)
            .invoke_async(&mut connection)
            .await;
        match reply {
            // A completed record answers `c` and the stored response.
            Ok(Value::Array(parts)) if parts.len() == 6 => counts.ok += 1,
            _ => counts.unexpected += 1,
        }
    }
    counts
}
