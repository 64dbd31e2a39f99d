//! `Idempotency-Key` middleware for tower: a keyed request's handler runs once; retries get the
//! stored response.
//!
//! Clients retry, queues redeliver and a timeout never says whether the work happened. With
//! [`IdempotencyLayer`] on a route, a client that sends the same `Idempotency-Key` again gets the
//! first response back, marked `Idempotent-Replayed: true`, and the handler's effect (a charge,
//! an email, a row) happens once.
//!
//! # Example
//!
//! ```no_run
//! use axum::{routing::post, Router};
//! use tower_once_idempotency::{scope::HeaderScope, IdempotencyLayer};
//!
//! async fn create_charge(body: String) -> (http::StatusCode, String) {
//!     // Runs once per (tenant, key), however often the client retries.
//!     (http::StatusCode::CREATED, format!("charged for {body}"))
//! }
//!
//! # #[tokio::main]
//! # async fn main() -> std::io::Result<()> {
//! let app = Router::new().route("/charges", post(create_charge)).layer(
//!     IdempotencyLayer::new()
//!         .require_key(true)
//!         .scope(HeaderScope::new("x-tenant-id")),
//! );
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//! axum::serve(listener, app).await
//! # }
//! ```
//!
//! # What happens to a request
//!
//! Requests whose method is not covered (by default all but `POST` and `PATCH`) pass through
//! untouched. For a covered request:
//!
//! 1. **Key.** The [`Idempotency-Key`](IDEMPOTENCY_KEY) header, a bare token or an RFC 8941
//!    string ([`key`]). Missing: pass through, or `400` with
//!    [`require_key`](IdempotencyLayer::require_key). Malformed or repeated: `400`.
//! 2. **Scope.** The record's identity is SHA-256 of ([scope], method, path, key), so tenants
//!    never share keys; a keyed request whose [scope] cannot name its tenant is refused
//!    (`401`), never put in a shared key space. The path is the one the client addressed:
//!    behind axum's `Router::nest` the layer reads axum's `OriginalUri` (in every build, not
//!    behind a feature), so nested routers never share records. The same key on another method or path is another record (keys
//!    are scoped per endpoint, as in the IETF draft and at Stripe).
//! 3. **Body.** Buffered up to [`body_limit`](IdempotencyLayer::body_limit) (`Content-Length` is
//!    checked first): over it, `413` and the handler never runs. The [fingerprint] is xxh3-128 of
//!    method, path and query, and body (SHA-256 on request; the [fingerprint] module says why
//!    either is enough, and how a record stored under the earlier SHA-256 default still
//!    replays).
//! 4. **Claim.** One store round trip either claims the key for a random [`ClaimToken`] with a
//!    short lease, or returns the record that holds it.
//! 5. **Run.** The handler runs with the [`ClaimToken`] and the record's
//!    [`StoreKey`](store::StoreKey) in its request extensions (derive a job id from the key, and
//!    a retry of the same request derives the same one); the lease is renewed every third of
//!    its length while it runs.
//! 6. **Finish.** The response is stored, or the key released, as the [predicate] decides, with
//!    a write fenced by the token.
//!
//! | situation                                        | answer                                          | handler runs |
//! |--------------------------------------------------|-------------------------------------------------|--------------|
//! | new key                                          | the handler's response (stored if 2xx/3xx/4xx but 400, 408, 413, 415, 422, 425, 429: [`RELEASED_CLIENT_ERRORS`](predicate::RELEASED_CLIENT_ERRORS)) | yes, once |
//! | same key, same request, completed                | stored status, headers, body, trailers + `Idempotent-Replayed: true` | no |
//! | same key, same request, still running            | `409` + `Retry-After` (lease left, at most 1 s) | no           |
//! | same key, same method and path, different query or body | `422` (problem type `…:fingerprint-mismatch`) | no     |
//! | same key, different method or path               | a separate record                               | yes, once    |
//! | handler answered 5xx, 408, 425 or 429, or failed | the handler's answer; key released              | next retry runs it |
//! | handler answered 400, 413, 415 or 422 (validation)    | the handler's answer; key released              | the fixed resend runs it |
//! | the client went away mid-run (disconnect, timeout) | the handler finishes on its own task; response stored ([`cancel_on_disconnect`](IdempotencyLayer::cancel_on_disconnect) to drop it and release the key instead); at shutdown, [`detached`](IdempotencyLayer::detached)`().wait()` after the server stopped lets such handlers finish, and every store write a dropped request left in flight land | no: the retry is replayed |
//! | the handler, or its response body, panicked      | the handler's key is released, and the release awaited, then the panic goes on to the caller (hyper ends the connection; tower-http's `CatchPanicLayer` outside answers `500`); the handler's future (or the body) is never polled again; a body's key is released too, also for a body streaming past the store limit | next retry runs it, even one sent the moment the panic is reported (a body's: once its release landed) |
//! | response larger than [`response_limit`](IdempotencyLayer::response_limit) (1 MiB) | the first caller gets it streamed in full; the key is kept (its lease renewed while it streams) and becomes not replayable when it ends, or released if the body fails | no (duplicates `409`) |
//! | request body over [`body_limit`](IdempotencyLayer::body_limit) (1 MiB) | `413`, after reading (and dropping) up to 4× the limit for at most about a second, so an uploading client reads it; a client that sends nothing gets it after that second, and the connection is closed | no |
//! | missing key with `require_key`, malformed or repeated key | `400`                                  | no           |
//! | keyed, but the [scope] names no tenant (no tenant header, no principal in the extensions) | `401` (problem type `…:missing-scope`) | no |
//! | store unreachable, slow or full                  | `503` + `Retry-After` (or run unclaimed with [`fail_open`](IdempotencyLayer::fail_open)) | no |
//!
//! A streaming response (SSE) on a covered route is over the store limit as soon as it passes
//! it: its first caller gets the stream, duplicates `409`. The layer's own errors are
//! `application/problem+json` (RFC 9457) with a stable `type` URI such as
//! `urn:tower-once:idempotency:in-progress`: see [`problem`]. gRPC clients get gRPC statuses instead, and a gRPC status in the response
//! headers or trailers decides storing the way an HTTP status does ([`predicate`]): a transient
//! code such as `UNAVAILABLE` releases the key, a final one is stored with its trailers and
//! replayed, so a replay returns the same status and message. On a tonic server the layer goes
//! on with `Server::builder().layer(...)`; clients send the key as `idempotency-key` metadata
//! (the HTTP `RetryLayer` of `tower-once-retry` stamps it), and a duplicate in flight gets
//! `UNAVAILABLE` with `grpc-retry-pushback-ms`, which that retry layer honours. Stored responses keep every header but hop-by-hop ones and those named with
//! [`strip_header`](IdempotencyLayer::strip_header).
//!
//! # Crashes and leases
//!
//! A claim is a lease: a process that dies mid-request stops renewing, and its key is free again
//! within one [`lease`](IdempotencyLayer::lease) (10 s by default), so the client's retry runs. A handler slower
//! than its lease keeps it as long as it is running. If it stalls so long that a renewal fails
//! (the store was down), another request may claim the key: the handler can compare its
//! [`ClaimToken`] with the record before committing to fence that case.
//!
//! Storing the response is a separate write after the handler: if that write fails, duplicates
//! get `409` until the lease expires and then run again. Nothing in a middleware can close that
//! window; a handler that writes its effect and the record in one transaction can: with the
//! Postgres store (feature `postgres`) made
//! [`transactional`](store::postgres::PostgresStore::transactional), the claim opens the
//! handler's transaction with the key's lock: the handler writes its effects on
//! [`Claim::transaction`] and [`Claim::commit`] writes the record and commits, so claim, effects
//! and record are one commit, and a crash before it frees the key at once. With the default
//! two-step claim, [`respond_in`](Claim::respond_in) stores the response in the handler's own
//! transaction, fenced by the claim.
//!
#![doc = include_str!("../docs/stores.md")]
//!
//! # Observability
//!
//! Each covered request runs in a `tracing` span named `idempotency` with the fields `method`,
//! `path`, `store_key` (the hashed record key, never the raw key) and `outcome`, one of
//! `claimed`, `stored`, `released`, `replayed`, `conflict`, `mismatch`, `rejected`,
//! `not_replayable`, `unavailable` or `unclaimed`. Rejections before the body is read are
//! `debug` events with `outcome = "rejected"`.
//!
//! # With axum
//!
//! `Router::layer` and `Router::route_layer` both work; so does any tower `Service` over
//! `http::Request`. With axum, the last `.layer` call is the outermost: an authentication layer
//! whose extension the [scope] reads goes after the idempotency layer's `.layer` (a scope that
//! cannot name the tenant refuses every keyed request, so a mistake there fails closed). The
//! repository's `examples/axum_tenants.rs` shows the production shape: keys scoped by the
//! tenant an auth middleware put in the request extensions, records in Redis, and the layer's
//! errors in the API's own format ([`problem`]). Responses are replayed for 24 h by default
//! ([`retention`](IdempotencyLayer::retention)); every setting is a builder method of
//! [`IdempotencyLayer`].
//!
//! # Differences from other idempotency middleware
//!
//! - The key is scoped and fingerprinted like Stripe's and the IETF draft's: reuse with another
//!   body or query on the same endpoint is `422`, never a silent replay of the wrong response.
//! - Claims are leased and fenced by token, so a crashed replica cannot hold a key forever nor
//!   overwrite a newer claim.
//! - 5xx and validation rejections release the key instead of caching a failure; a client
//!   that goes away does not make the effect run twice.
//!
//! What each project documents (checked 2026-11; corrections welcome). "n/d": not documented.
//! `tower::retry`, `tower::timeout`, tower-http, tower-resilience and reqwest-retry have no
//! server-side idempotency keys.
//!
//! | | tower-once | axum-idempotent | Stripe API | IETF draft |
//! |---|---|---|---|---|
//! | server-side idempotency keys | ✓ any tower server, scoped per tenant | ✓ axum, in a session store | ✓ | ✓ (spec) |
//! | concurrent duplicate | `409` + `Retry-After` | n/d | `409` | `409` |
//! | same key, other request | `422` | a new key (hashing mode) | error | `422` |
//! | crashed owner frees the key | within one lease | n/d | n/d | – |
//!
//! # Feature flags
//!
//! | feature       | enables |
//! |---------------|---------|
//! | `redis`       | `store::redis`: `RedisStore` for Redis and Redis Cluster |
//! | `postgres`    | `store::postgres`: `PostgresStore`, [`Claim::transaction`] and [`Claim::commit`] (one transaction per fresh request), [`Claim::respond_in`] (the two-step claim) |
//! | `conformance` | [`store::conformance`], the test suite for store implementations |
//! | `metrics`     | `tower_once_idempotency_requests_total{outcome}`, one per covered request, through the `metrics` facade |
//! | `axum`        | nothing any more: records always follow axum's `OriginalUri`; kept so that manifests naming it build |
//!
//! # Minimum supported Rust version
//!
//! 1.88. Raising it is a minor-version change.

// Feature-gated items show their feature on docs.rs.
#![cfg_attr(docsrs, feature(doc_cfg))]
// Library code never unwraps: a panic on input is a bug (tests may).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod body;
mod claim;
mod config;
mod detached;
mod digest;
pub mod fingerprint;
mod future;
mod headers;
pub mod key;
mod layer;
mod metrics;
mod path;
pub mod predicate;
pub mod problem;
pub mod scope;
mod service;
pub mod store;

pub use self::body::{RequestBody, ResponseBody};
#[doc(hidden)]
pub use self::claim::JobRecord;
pub use self::claim::{Claim, ClaimError};
pub use self::config::{IDEMPOTENCY_IN_PROGRESS, IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED};
pub use self::detached::Detached;
pub use self::future::ResponseFuture;
pub use self::layer::IdempotencyLayer;
pub use self::service::Idempotency;
pub use self::store::ClaimToken;
pub use self::store::Settled;
