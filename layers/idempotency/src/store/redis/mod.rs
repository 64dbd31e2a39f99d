//! The Redis store (feature `redis`): one set of keys for many replicas, on Redis or Redis
//! Cluster (7.0 or newer). It uses only commands Valkey shares, but is not tested on Valkey.
//!
//! ```no_run
//! use tower_once_idempotency::store::redis::RedisStore;
//! use tower_once_idempotency::IdempotencyLayer;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let store = RedisStore::connect("redis://127.0.0.1:6379").await?;
//! // Or RedisStore::connect_cluster(["redis://10.0.0.1:7000", "redis://10.0.0.2:7000"]).await?
//! let layer = IdempotencyLayer::with_store(store);
//! # let _ = layer;
//! # Ok(())
//! # }
//! ```
//!
//! # How records are kept
//!
//! Each record is one Redis hash under `{prefix}{store key as 64 hex digits}` (default prefix
//! `tower-once:idem:`), with the fields `s` (state: `p` in progress, `c` completed, `n` not
//! replayable), `t` (claim token, 16 bytes, only while in progress), `f` (fingerprint, 32
//! bytes), and once completed `st` (status), `h` (headers, [postcard]-encoded name/value pairs),
//! `b` (the body, raw bytes) and `tr` (trailers, if any). Leases and retention are the key's
//! own TTL (`PEXPIRE`), so Redis expires them with no sweeper.
//!
//! Every operation is one Lua script touching one key, sent with `EVALSHA` (the scripts are
//! loaded on first use and again if the server lost its script cache, after a restart for
//! example). A request through the layer therefore costs: fresh 2 round trips (claim,
//! complete; plus one renewal per third of the lease for slow handlers), replay 1, conflict 1,
//! mismatch 1. Because each script names its one key, the same scripts run unchanged on Redis
//! Cluster (the cluster client routes by key slot; tested on a local three-master cluster) and
//! use only commands Valkey shares with Redis 7 (Valkey itself is not tested).
//!
//! Each command is bounded by a timeout (default 1 s). A command that times out or fails turns
//! into a [`StoreError`], and the layer answers `503` without running the handler. The default
//! connection, [`ConnectionManager`], reconnects on its own: once Redis is back, requests
//! succeed again without a restart.
//!
//! # Durability: what Redis can lose
//!
//! The store is exactly as durable as the Redis behind it:
//!
//! - **A restart without persistence** (no RDB/AOF) empties every record. In-progress claims are
//!   forgotten (a duplicate arriving while the first is still running then runs too), and so are
//!   completed ones (a retry after the restart runs the handler again).
//! - **With AOF `appendfsync everysec`** up to about a second of writes can be lost on a crash,
//!   with the same effects for the records written in that second.
//! - **A failover** promotes a replica that may lag its primary (replication is asynchronous):
//!   claims and completions not yet replicated are lost. `WAIT` is not used, so a completion is
//!   acknowledged before it reaches a replica.
//!
//! When a duplicate effect would be costly even in these windows, make the handler itself
//! idempotent at its own store (a unique constraint on the key, or fencing its write with the
//! [`ClaimToken`]).

mod codec;
mod scripts;

use self::codec::{decode_claim, decode_flag, encode_headers};
pub use self::scripts::{CLAIM_SCRIPT, COMPLETE_SCRIPT, EXTEND_SCRIPT, RELEASE_SCRIPT};
use super::{ClaimOutcome, ClaimToken, Completion, IdempotencyStore, StoreError, StoreKey};
use crate::fingerprint::Fingerprint;
use redis::aio::ConnectionLike;
use redis::{Script, Value};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;
use tower_once_core::backoff::Backoff;

/// The `redis` client this store is built on, to make connections of the matching version.
pub use ::redis;
pub use redis::aio::ConnectionManager;
pub use redis::cluster_async::ClusterConnection;

/// A boxed store future: the `redis` client's own futures are boxed, so nothing is lost.
pub use super::StoreFuture;

/// An [`IdempotencyStore`] on Redis or Redis Cluster. See the [module docs](self).
///
/// `C` is the connection: [`ConnectionManager`] (one server, reconnecting) by default,
/// [`ClusterConnection`] for a cluster, or any other cloneable `redis` async connection.
#[derive(Clone)]
pub struct RedisStore<C = ConnectionManager> {
    connection: C,
    shared: Arc<Shared>,
}

struct Shared {
    prefix: String,
    timeout: Duration,
    // The completions and releases sent again after a failure, counted for the shutdown.
    background: crate::Detached,
    claim: Script,
    complete: Script,
    release: Script,
    extend: Script,
}

impl<C> fmt::Debug for RedisStore<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("connection", &std::any::type_name::<C>())
            .field("prefix", &self.shared.prefix)
            .field("timeout", &self.shared.timeout)
            .finish()
    }
}

/// The default key prefix.
pub const DEFAULT_PREFIX: &str = "tower-once:idem:";

impl RedisStore<ConnectionManager> {
    /// Connects to one Redis server, e.g. `redis://127.0.0.1:6379/0`.
    ///
    /// The connection is made lazily and remade on its own after a failure, so this succeeds
    /// while Redis is still down (requests get `503` until it is up). Fails only on a malformed
    /// URL.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        Self::connect_with_timeout(url, Duration::from_secs(1)).await
    }

    /// [`connect`](Self::connect) with a per-command timeout other than 1 s.
    pub async fn connect_with_timeout(url: &str, timeout: Duration) -> Result<Self, StoreError> {
        let client = redis::Client::open(url).map_err(StoreError::unavailable)?;
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_secs(1));
        let connection = ConnectionManager::new_lazy_with_config(client, config)
            .map_err(StoreError::unavailable)?;
        Ok(Self::new(connection).command_timeout(timeout))
    }
}

impl RedisStore<ClusterConnection> {
    /// Connects to a Redis Cluster through any of its nodes, e.g.
    /// `["redis://127.0.0.1:7000", "redis://127.0.0.1:7001"]`.
    pub async fn connect_cluster<I, T>(nodes: I) -> Result<Self, StoreError>
    where
        I: IntoIterator<Item = T>,
        T: redis::IntoConnectionInfo,
    {
        let timeout = Duration::from_secs(1);
        let client = redis::cluster::ClusterClientBuilder::new(nodes)
            .connection_timeout(timeout)
            .response_timeout(timeout)
            .build()
            .map_err(StoreError::unavailable)?;
        let connection = client
            .get_async_connection()
            .await
            .map_err(StoreError::unavailable)?;
        Ok(Self::new(connection))
    }
}

impl<C> RedisStore<C> {
    /// A store over an existing connection, with the default prefix and a 1 s command timeout.
    pub fn new(connection: C) -> Self {
        Self {
            connection,
            shared: Arc::new(Shared {
                prefix: DEFAULT_PREFIX.to_owned(),
                timeout: Duration::from_secs(1),
                background: crate::Detached::default(),
                claim: Script::new(CLAIM_SCRIPT),
                complete: Script::new(COMPLETE_SCRIPT),
                release: Script::new(RELEASE_SCRIPT),
                extend: Script::new(EXTEND_SCRIPT),
            }),
        }
    }

    /// The prefix of every key this store writes. Default `tower-once:idem:`.
    pub fn key_prefix(self, prefix: impl Into<String>) -> Self {
        self.map_shared(|shared| shared.prefix = prefix.into())
    }

    /// The longest a single command may take before it fails with [`StoreError::timeout`].
    /// Default 1 s.
    ///
    /// # Panics
    ///
    /// If `timeout` is zero.
    pub fn command_timeout(self, timeout: Duration) -> Self {
        assert!(
            !timeout.is_zero(),
            "RedisStore::command_timeout must not be zero"
        );
        self.map_shared(|shared| shared.timeout = timeout)
    }

    /// The Redis key of a record.
    pub fn redis_key(&self, key: StoreKey) -> String {
        use std::fmt::Write as _;
        let mut name = String::with_capacity(self.shared.prefix.len() + 64);
        name.push_str(&self.shared.prefix);
        // Writing to a `String` cannot fail.
        let _ = write!(name, "{key}");
        name
    }

    /// The connection.
    pub fn connection(&self) -> &C {
        &self.connection
    }

    fn map_shared(mut self, f: impl FnOnce(&mut Shared)) -> Self {
        let mut shared = Shared {
            prefix: self.shared.prefix.clone(),
            timeout: self.shared.timeout,
            background: self.shared.background.clone(),
            claim: Script::new(CLAIM_SCRIPT),
            complete: Script::new(COMPLETE_SCRIPT),
            release: Script::new(RELEASE_SCRIPT),
            extend: Script::new(EXTEND_SCRIPT),
        };
        f(&mut shared);
        self.shared = Arc::new(shared);
        self
    }
}

/// Which script to run, with its arguments.
enum Call {
    Claim(ClaimToken, Fingerprint, Duration),
    Complete(ClaimToken, Completion, Duration),
    Release(ClaimToken),
    Extend(ClaimToken, Duration),
}

impl<C> RedisStore<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    fn run<T: Send + 'static>(
        &self,
        key: StoreKey,
        call: Call,
        decode: fn(Value) -> Result<T, StoreError>,
    ) -> StoreFuture<T> {
        let mut connection = self.connection.clone();
        let shared = Arc::clone(&self.shared);
        let redis_key = self.redis_key(key);
        Box::pin(async move {
            let outcome = invoke(&shared, &mut connection, &redis_key, &call).await;
            if outcome.is_err() && matches!(call, Call::Complete(..) | Call::Release(..)) {
                // NOTE: a timed-out command may still run, fail with NOSCRIPT (the reload
                // redis-rs would do happened in the future the timeout dropped), or be lost
                // with its connection. A completion or release left undone holds the key for
                // a whole lease, or lets a duplicate run the handler twice; both are fenced by
                // the claim's token, so sending them again is safe.
                let background = shared.background.clone();
                background.spawn(finish_later(shared, connection, redis_key, call));
            }
            decode(outcome?)
        })
    }
}

/// Sends one script call, bounded by the command timeout.
async fn invoke<C: ConnectionLike>(
    shared: &Shared,
    connection: &mut C,
    redis_key: &str,
    call: &Call,
) -> Result<Value, StoreError> {
    let mut invocation = match call {
        Call::Claim(..) => shared.claim.key(redis_key),
        Call::Complete(..) => shared.complete.key(redis_key),
        Call::Release(..) => shared.release.key(redis_key),
        Call::Extend(..) => shared.extend.key(redis_key),
    };
    match call {
        Call::Claim(token, fingerprint, lease) => invocation
            .arg(token.as_uuid().as_bytes().as_slice())
            .arg(fingerprint.as_bytes().as_slice())
            .arg(millis(*lease)),
        Call::Complete(token, completion, retention) => {
            invocation
                .arg(token.as_uuid().as_bytes().as_slice())
                .arg(millis(*retention));
            match completion {
                Completion::Response(response) => invocation
                    .arg("c")
                    .arg(response.status.as_u16())
                    .arg(encode_headers(&response.headers)?)
                    .arg(response.body.as_ref())
                    .arg(match &response.trailers {
                        Some(trailers) => encode_headers(trailers)?,
                        None => Vec::new(),
                    }),
                Completion::NotReplayable => invocation.arg("n"),
            }
        }
        Call::Release(token) => invocation.arg(token.as_uuid().as_bytes().as_slice()),
        Call::Extend(token, lease) => invocation
            .arg(token.as_uuid().as_bytes().as_slice())
            .arg(millis(*lease)),
    };
    tokio::time::timeout(shared.timeout, invocation.invoke_async::<Value>(connection))
        .await
        .map_err(|_| StoreError::timeout())?
        .map_err(StoreError::unavailable)
}

/// Waits between the background tries of a completion or release (200 ms doubling to 2 s,
/// seven tries): about 9 s in all, most of a default lease.
const FINISH_LATER: Backoff = Backoff::doubling(Duration::from_millis(200), Duration::from_secs(2));
const FINISH_TRIES: u32 = 7;

/// Sends a completion or release again until Redis answers (it is fenced by the token: if the
/// first one did land, this one finds the record no longer ours and changes nothing).
async fn finish_later<C: ConnectionLike>(
    shared: Arc<Shared>,
    mut connection: C,
    redis_key: String,
    call: Call,
) {
    for n in 1..=FINISH_TRIES {
        tokio::time::sleep(FINISH_LATER.exponential(n)).await;
        match invoke(&shared, &mut connection, &redis_key, &call).await {
            Ok(_) => {
                tracing::debug!("a completion or release that had failed went through");
                return;
            }
            Err(error) => tracing::debug!(%error, "retrying a failed completion or release"),
        }
    }
    tracing::warn!(
        "gave up finishing a claim in Redis; the key frees itself when its lease expires"
    );
}

impl<C> IdempotencyStore for RedisStore<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    type ClaimFuture = StoreFuture<ClaimOutcome>;
    type CompleteFuture = StoreFuture<bool>;
    type ReleaseFuture = StoreFuture<bool>;
    type ExtendFuture = StoreFuture<bool>;

    fn claim(
        &self,
        key: StoreKey,
        token: ClaimToken,
        fingerprint: Fingerprint,
        lease: Duration,
    ) -> Self::ClaimFuture {
        self.run(key, Call::Claim(token, fingerprint, lease), decode_claim)
    }

    fn complete(
        &self,
        key: StoreKey,
        token: ClaimToken,
        completion: Completion,
        retention: Duration,
    ) -> Self::CompleteFuture {
        self.run(
            key,
            Call::Complete(token, completion, retention),
            decode_flag,
        )
    }

    fn release(&self, key: StoreKey, token: ClaimToken) -> Self::ReleaseFuture {
        self.run(key, Call::Release(token), decode_flag)
    }

    fn extend(&self, key: StoreKey, token: ClaimToken, lease: Duration) -> Self::ExtendFuture {
        self.run(key, Call::Extend(token, lease), decode_flag)
    }

    fn background(&self) -> Option<crate::Detached> {
        Some(self.shared.background.clone())
    }
}

/// Milliseconds, at least 1 (`PEXPIRE 0` would delete the key at once) and at most about 100
/// years: Redis refuses an expiry whose end overflows, which would leave a script half done.
fn millis(duration: Duration) -> u64 {
    let capped = duration.min(crate::config::MAX_DURATION);
    u64::try_from(capped.as_millis()).unwrap_or(1).max(1)
}
