//! Where idempotency records live, and the contract a store must keep.
//!
//! A record is created by [`IdempotencyStore::claim`] in the *in progress* state, owned by the
//! random [`ClaimToken`] that the claim carried, and lives for a short *lease*. The owner then
//! either [`complete`](IdempotencyStore::complete)s it (it becomes *completed* and lives for the
//! retention period), [`release`](IdempotencyStore::release)s it (it disappears, so a retry runs
//! again) or [`extend`](IdempotencyStore::extend)s the lease while its handler is still running.
//!
//! ```text
//!               claim (absent or expired)
//!   (absent) ─────────────────────────────▶ InProgress{token, lease}
//!      ▲  ▲                                   │   │   │ extend(token): lease renewed
//!      │  └──── release(token) ───────────────┘   │   └──────────────┘
//!      │  └──── lease expires ────────────────────┤
//!      │                                          │ complete(token)
//!      └──── retention expires ─── Completed / NotReplayable
//! ```
//!
//! # The contract
//!
//! Every implementation must keep these rules; [`conformance`] (feature `conformance`) checks
//! them against a live store, and [`MemoryStore`] and the Redis store both pass it.
//!
//! 1. **claim is atomic.** Of any number of concurrent claims of one absent key, exactly one
//!    returns [`ClaimOutcome::Claimed`]; every other returns [`ClaimOutcome::Existing`] with the
//!    record as it is. A record whose lease or retention has expired counts as absent.
//! 2. **Writes are fenced by the token.** `complete`, `release` and `extend` change the record
//!    only if it is *in progress* and holds the same token, and return `Ok(true)`; otherwise they
//!    change nothing and return `Ok(false)`. A stale owner (whose lease expired and whose key was
//!    claimed again) can never overwrite or free the newer claim, and a completed record can never
//!    be released or extended.
//! 3. **Records round-trip.** A completed record returns the status, every header (in order,
//!    repeated names included), the body bytes and the trailers exactly as given, and the
//!    fingerprint given at claim time.
//! 4. **Expiry.** An in-progress record disappears once its lease passes without an `extend`; a
//!    completed record once its retention passes. Stores measure time with their own clock;
//!    [`MemoryStore`] uses tokio's, so paused-time tests can drive it.
//! 5. **Errors are errors.** When the store cannot tell (unreachable, timed out, full), it returns
//!    a [`StoreError`]; the layer then fails closed (`503`) and never runs the handler without a
//!    claim.
//!
//! An operation may take effect when its method is called or when its future is first polled. If
//! the layer's future is dropped mid-operation, it spawns the pending future on the current tokio
//! runtime so the operation is not lost; a store must therefore tolerate its futures being moved
//! to another task.
//!
//! # Implementing a store
//!
//! The associated futures are named so the layer's response future needs no boxing when the store
//! needs none (the memory store returns [`std::future::Ready`]). A store whose client hands out
//! boxed futures can use `Pin<Box<dyn Future<Output = ...> + Send>>`.

mod memory;

#[cfg(feature = "conformance")]
pub mod conformance;

#[cfg(feature = "redis")]
pub mod redis;

pub use self::memory::{MemoryStore, MemoryStoreBuilder};

use crate::fingerprint::Fingerprint;
use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use std::error::Error as StdError;
use std::fmt;
use std::future::Future;
use std::time::Duration;

/// A store of idempotency records. See the [module docs](self) for the contract.
///
/// Cloning a store must be cheap and yield a handle to the same records (an `Arc` inside).
///
/// ```
/// use std::time::Duration;
/// use tower_once_idempotency::fingerprint::Fingerprint;
/// use tower_once_idempotency::store::{
///     ClaimOutcome, ClaimToken, Completion, IdempotencyStore, MemoryStore, RecordState, StoreKey,
///     StoredResponse,
/// };
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store = MemoryStore::new();
/// let key = StoreKey::from_bytes([1; 32]);
/// let fingerprint = Fingerprint::from_bytes([2; 32]);
/// let token = ClaimToken::new();
///
/// let outcome = store.claim(key, token, fingerprint, Duration::from_secs(10)).await?;
/// assert!(matches!(outcome, ClaimOutcome::Claimed));
///
/// let response = StoredResponse::new(http::StatusCode::CREATED, Default::default(), "done".into());
/// let day = Duration::from_secs(24 * 3600);
/// assert!(store.complete(key, token, Completion::Response(response), day).await?);
///
/// let again = store.claim(key, ClaimToken::new(), fingerprint, Duration::from_secs(10)).await?;
/// match again {
///     ClaimOutcome::Existing(record) => {
///         assert!(matches!(record.state, RecordState::Completed(r) if r.body == "done"));
///     }
///     ClaimOutcome::Claimed => unreachable!("the key is completed"),
/// }
/// # Ok(())
/// # }
/// ```
pub trait IdempotencyStore: Clone + Send + Sync + 'static {
    /// Future returned by [`claim`](Self::claim).
    type ClaimFuture: Future<Output = Result<ClaimOutcome, StoreError>> + Send + Unpin + 'static;
    /// Future returned by [`complete`](Self::complete).
    type CompleteFuture: Future<Output = Result<bool, StoreError>> + Send + Unpin + 'static;
    /// Future returned by [`release`](Self::release).
    type ReleaseFuture: Future<Output = Result<bool, StoreError>> + Send + Unpin + 'static;
    /// Future returned by [`extend`](Self::extend).
    type ExtendFuture: Future<Output = Result<bool, StoreError>> + Send + Unpin + 'static;

    /// Claims `key` for `token` with a lease of `lease`, or returns the record that holds it.
    fn claim(
        &self,
        key: StoreKey,
        token: ClaimToken,
        fingerprint: Fingerprint,
        lease: Duration,
    ) -> Self::ClaimFuture;

    /// Turns the in-progress record of `key` held by `token` into a completed one that lives for
    /// `retention`. `Ok(false)` if the record is not in progress under `token`.
    fn complete(
        &self,
        key: StoreKey,
        token: ClaimToken,
        completion: Completion,
        retention: Duration,
    ) -> Self::CompleteFuture;

    /// Deletes the in-progress record of `key` held by `token`. `Ok(false)` if the record is not
    /// in progress under `token`.
    fn release(&self, key: StoreKey, token: ClaimToken) -> Self::ReleaseFuture;

    /// Renews the lease of the in-progress record of `key` held by `token` to `lease` from now.
    /// `Ok(false)` if the record is not in progress under `token`.
    fn extend(&self, key: StoreKey, token: ClaimToken, lease: Duration) -> Self::ExtendFuture;
}

/// The identity of a record: SHA-256 of the scope, method, path and idempotency key.
///
/// The path is the one the client addressed: behind an axum `Router::nest` (or a `route_layer`
/// inside one) the layer sees a path stripped of the nest prefix, so with the `axum` feature
/// (on by default in the `tower-once` facade) it reads axum's `OriginalUri` extension instead.
/// Two nested routers sharing one store, or `/accounts/{a}/..` and `/accounts/{b}/..` behind
/// one nested router, never share a record.
///
/// A key also carries a tag of its scope, which the [`MemoryStore`] uses to share its room
/// fairly between scopes; the tag is not part of the key's identity (equality, hashing and
/// [`Display`](fmt::Display) use the digest alone).
///
/// Its [`Display`](fmt::Display) form (64 lowercase hex digits) is what stores use as a key name.
///
/// ```
/// use tower_once_idempotency::store::StoreKey;
///
/// let (parts, ()) = http::Request::post("/charges?x=1").body(()).unwrap().into_parts();
/// let a = StoreKey::derive(b"tenant-a", &parts, "k1");
/// let b = StoreKey::derive(b"tenant-b", &parts, "k1");
/// assert_ne!(a, b, "tenants never share keys");
/// assert_eq!(a.to_string().len(), 64);
/// ```
#[derive(Clone, Copy)]
pub struct StoreKey {
    digest: [u8; 32],
    scope_tag: u64,
}

impl PartialEq for StoreKey {
    fn eq(&self, other: &Self) -> bool {
        self.digest == other.digest
    }
}

impl Eq for StoreKey {}

impl std::hash::Hash for StoreKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.digest.hash(state);
    }
}

impl PartialOrd for StoreKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for StoreKey {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.digest.cmp(&other.digest)
    }
}

impl StoreKey {
    /// Derives the key of a request from its scope, method, path as the client addressed it
    /// (without the query) and idempotency key.
    pub fn derive(scope: &[u8], parts: &http::request::Parts, key: &str) -> Self {
        use crate::fingerprint::update_framed;
        use sha2::{Digest, Sha256};
        let mut hasher = Sha256::new();
        hasher.update(b"tower-once/key/v1");
        update_framed(&mut hasher, scope);
        update_framed(&mut hasher, parts.method.as_str().as_bytes());
        update_framed(&mut hasher, addressed_path(parts).as_bytes());
        update_framed(&mut hasher, key.as_bytes());
        Self {
            digest: hasher.finalize().into(),
            scope_tag: scope_tag(scope),
        }
    }

    /// Wraps 32 raw bytes (for stores that read keys back, and for tests), in the empty scope.
    pub const fn from_bytes(bytes: [u8; 32]) -> Self {
        Self {
            digest: bytes,
            scope_tag: 0,
        }
    }

    /// The same key, tagged as belonging to `scope` (for stores that share room by scope).
    pub fn with_scope(self, scope: &[u8]) -> Self {
        Self {
            scope_tag: scope_tag(scope),
            ..self
        }
    }

    /// The raw bytes.
    pub const fn as_bytes(&self) -> &[u8; 32] {
        &self.digest
    }

    /// A tag of the key's scope: equal for keys of one scope within one process (it is a
    /// keyed hash, so it means nothing to another process and a client cannot aim at another
    /// scope's tag). `0` for the empty scope.
    pub fn scope_tag(&self) -> u64 {
        self.scope_tag
    }
}

/// The path the client addressed: axum's `OriginalUri` when a nesting router stripped a prefix.
fn addressed_path(parts: &http::request::Parts) -> &str {
    #[cfg(feature = "axum")]
    if let Some(original) = parts.extensions.get::<axum::extract::OriginalUri>() {
        return original.0.path();
    }
    parts.uri.path()
}

fn scope_tag(scope: &[u8]) -> u64 {
    use std::hash::BuildHasher;
    use std::sync::OnceLock;
    static KEYS: OnceLock<std::collections::hash_map::RandomState> = OnceLock::new();
    if scope.is_empty() {
        return 0;
    }
    KEYS.get_or_init(Default::default).hash_one(scope)
}

impl fmt::Display for StoreKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_hex(f, &self.digest)
    }
}

impl fmt::Debug for StoreKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "StoreKey({self})")
    }
}

pub(crate) fn write_hex(f: &mut fmt::Formatter<'_>, bytes: &[u8]) -> fmt::Result {
    bytes.iter().try_for_each(|b| write!(f, "{b:02x}"))
}

/// The random token that owns a claim, fencing every later write to the record.
///
/// The layer inserts it into the request's extensions before calling the handler, so the handler
/// can fence its own writes with it (for example store it beside the row it inserts, and refuse
/// to commit when a newer token owns the key).
///
/// ```
/// use tower_once_idempotency::store::ClaimToken;
///
/// async fn handler(req: http::Request<()>) {
///     if let Some(token) = req.extensions().get::<ClaimToken>() {
///         println!("running under claim {token}");
///     }
/// }
/// assert_ne!(ClaimToken::new(), ClaimToken::new());
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ClaimToken(uuid::Uuid);

impl ClaimToken {
    /// A fresh random (version 4 UUID) token.
    #[allow(clippy::new_without_default)]
    pub fn new() -> Self {
        Self(uuid::Uuid::new_v4())
    }

    /// Wraps a token read back from a store.
    pub const fn from_uuid(uuid: uuid::Uuid) -> Self {
        Self(uuid)
    }

    /// The token as a UUID.
    pub const fn as_uuid(&self) -> &uuid::Uuid {
        &self.0
    }
}

impl fmt::Display for ClaimToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0.hyphenated(), f)
    }
}

impl fmt::Debug for ClaimToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ClaimToken({self})")
    }
}

/// What [`IdempotencyStore::claim`] found.
// Moved once per request; boxing would add an allocation to every replay.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum ClaimOutcome {
    /// The key was free and is now in progress under the given token.
    Claimed,
    /// The key is held by an existing record, returned as it is.
    Existing(ExistingRecord),
}

/// A record that already holds a key.
#[derive(Debug, Clone)]
pub struct ExistingRecord {
    /// The fingerprint of the request that created the record.
    pub fingerprint: Fingerprint,
    /// Where the record is in its life.
    pub state: RecordState,
}

/// The state of an existing record.
// Moved once per request; boxing would add an allocation to every replay.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum RecordState {
    /// A handler is running under a claim; its lease ends after `lease_remaining`.
    InProgress {
        /// Time left on the lease.
        lease_remaining: Duration,
    },
    /// The handler finished and its response is stored.
    Completed(StoredResponse),
    /// The handler finished but its response was too large to store; it cannot be replayed.
    NotReplayable,
}

/// How an in-progress record ends, given to [`IdempotencyStore::complete`].
// Moved once per request; boxing would add an allocation to every replay.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum Completion {
    /// Store this response for replay.
    Response(StoredResponse),
    /// The handler ran, but its response is not kept (too large): later duplicates get an error
    /// and never run the handler again.
    NotReplayable,
}

/// A response as stored for replay: status, headers, body and trailers.
///
/// ```
/// use tower_once_idempotency::store::StoredResponse;
///
/// let mut headers = http::HeaderMap::new();
/// headers.insert("content-type", "application/json".parse().unwrap());
/// let stored = StoredResponse::new(http::StatusCode::CREATED, headers, "{}".into());
/// assert_eq!(stored.status, 201);
/// assert!(stored.trailers.is_none());
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct StoredResponse {
    /// The status code.
    pub status: StatusCode,
    /// The headers, hop-by-hop and deny-listed ones removed.
    pub headers: HeaderMap,
    /// The complete body.
    pub body: Bytes,
    /// The trailers, if the body ended with any (gRPC's `grpc-status` lives there).
    pub trailers: Option<HeaderMap>,
}

impl StoredResponse {
    /// A stored response without trailers.
    pub fn new(status: StatusCode, headers: HeaderMap, body: Bytes) -> Self {
        Self {
            status,
            headers,
            body,
            trailers: None,
        }
    }

    /// Sets the trailers.
    pub fn with_trailers(mut self, trailers: HeaderMap) -> Self {
        self.trailers = Some(trailers);
        self
    }

    /// An estimate of the bytes this record occupies (headers, body and trailers).
    pub fn approximate_size(&self) -> usize {
        fn map_size(map: &HeaderMap) -> usize {
            map.iter()
                .map(|(k, v)| k.as_str().len() + v.len() + 32)
                .sum()
        }
        64 + map_size(&self.headers) + self.body.len() + self.trailers.as_ref().map_or(0, map_size)
    }
}

/// A store could not carry out an operation.
///
/// ```
/// use tower_once_idempotency::store::StoreError;
///
/// let err = StoreError::unavailable(std::io::Error::other("connection refused"));
/// assert!(err.is_unavailable());
/// assert!(std::error::Error::source(&err).is_some());
/// assert!(StoreError::full().is_full());
/// ```
#[derive(Debug)]
pub struct StoreError {
    kind: StoreErrorKind,
    source: Option<Box<dyn StdError + Send + Sync>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StoreErrorKind {
    Unavailable,
    Timeout,
    Full,
    Corrupt,
}

impl StoreError {
    /// The store could not be reached or answered with an error.
    pub fn unavailable(source: impl Into<Box<dyn StdError + Send + Sync>>) -> Self {
        Self {
            kind: StoreErrorKind::Unavailable,
            source: Some(source.into()),
        }
    }

    /// The store did not answer in time.
    pub fn timeout() -> Self {
        Self {
            kind: StoreErrorKind::Timeout,
            source: None,
        }
    }

    /// The store is at capacity and holds nothing it may evict.
    pub fn full() -> Self {
        Self {
            kind: StoreErrorKind::Full,
            source: None,
        }
    }

    /// The store returned a record it cannot decode.
    pub fn corrupt(source: impl Into<Box<dyn StdError + Send + Sync>>) -> Self {
        Self {
            kind: StoreErrorKind::Corrupt,
            source: Some(source.into()),
        }
    }

    /// Whether the store could not be reached.
    pub fn is_unavailable(&self) -> bool {
        self.kind == StoreErrorKind::Unavailable
    }

    /// Whether the store did not answer in time.
    pub fn is_timeout(&self) -> bool {
        self.kind == StoreErrorKind::Timeout
    }

    /// Whether the store is full.
    pub fn is_full(&self) -> bool {
        self.kind == StoreErrorKind::Full
    }

    /// Whether the store returned an undecodable record.
    pub fn is_corrupt(&self) -> bool {
        self.kind == StoreErrorKind::Corrupt
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.kind {
            StoreErrorKind::Unavailable => "idempotency store unavailable",
            StoreErrorKind::Timeout => "idempotency store timed out",
            StoreErrorKind::Full => "idempotency store is full",
            StoreErrorKind::Corrupt => "idempotency store returned a corrupt record",
        })
    }
}

impl StdError for StoreError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn StdError + 'static))
    }
}
