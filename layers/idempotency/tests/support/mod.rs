//! What the idempotency crate's test files share: a handler whose query scripts it, counting
//! its runs and the claim tokens it saw; building a keyed `POST`, sending it through a service
//! and reading the answer; and an axum server on a loopback port.

#![allow(dead_code)] // each test file uses its own part

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;
use tower::Service;
use tower_once_idempotency::store::ClaimToken;
use tower_once_idempotency::RequestBody;

pub(crate) type Req = Request<RequestBody<Full<Bytes>>>;

/// A handler that counts its runs. The query controls it: `status=N` answers N, `sleep_ms=N`
/// sleeps first, `big=N` answers N bytes, `fail` returns a service error.
#[derive(Clone, Default)]
pub(crate) struct Handler {
    pub(crate) runs: Arc<AtomicUsize>,
    pub(crate) tokens: Arc<std::sync::Mutex<Vec<ClaimToken>>>,
}

impl Handler {
    pub(crate) fn runs(&self) -> usize {
        self.runs.load(SeqCst)
    }

    /// How many of its runs saw a claim token.
    pub(crate) fn tokens_seen(&self) -> usize {
        self.tokens.lock().unwrap().len()
    }
}

impl Service<Req> for Handler {
    type Response = Response<Full<Bytes>>;
    type Error = &'static str;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let run = self.runs.fetch_add(1, SeqCst) + 1;
        if let Some(token) = req.extensions().get::<ClaimToken>() {
            self.tokens.lock().unwrap().push(*token);
        }
        Box::pin(async move {
            let query = req.uri().query().unwrap_or("").to_owned();
            let param = |name: &str| {
                query.split('&').find_map(|kv| {
                    kv.strip_prefix(name)?
                        .strip_prefix('=')?
                        .parse::<u64>()
                        .ok()
                })
            };
            if let Some(ms) = param("sleep_ms") {
                tokio::time::sleep(Duration::from_millis(ms)).await;
            }
            if query.contains("fail") {
                return Err("inner service failed");
            }
            let body = req.into_body().collect().await.unwrap().to_bytes();
            let status = StatusCode::from_u16(param("status").unwrap_or(201) as u16).unwrap();
            let payload = match param("big") {
                Some(n) => Bytes::from(vec![b'x'; n as usize]),
                None => Bytes::from(format!("run {run}: {}", String::from_utf8_lossy(&body))),
            };
            Ok(Response::builder()
                .status(status)
                .header("content-type", "text/plain")
                .header("set-cookie", "a=1")
                .header("set-cookie", "b=2")
                .header("x-run", run.to_string())
                .header("connection", "x-hop")
                .header("x-hop", "per-connection")
                .header("keep-alive", "timeout=5")
                .body(Full::new(payload))
                .unwrap())
        })
    }
}

/// A `POST` to `uri` carrying `body`, and `key` as its `Idempotency-Key` when there is one.
pub(crate) fn post(uri: &str, key: Option<&str>, body: &str) -> Request<Full<Bytes>> {
    let mut builder = Request::post(uri);
    if let Some(key) = key {
        builder = builder.header("idempotency-key", key);
    }
    builder
        .body(Full::new(Bytes::copy_from_slice(body.as_bytes())))
        .unwrap()
}

/// A `POST` to `uri` carrying `body` and these headers, appended in order (a name may repeat).
pub(crate) fn post_with(uri: &str, headers: &[(&str, &str)], body: &str) -> Request<Full<Bytes>> {
    let mut req = post(uri, None, body);
    for (name, value) in headers {
        req.headers_mut().append(
            http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            http::HeaderValue::from_str(value).unwrap(),
        );
    }
    req
}

/// A response read to its end.
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) version: http::Version,
    pub(crate) status: StatusCode,
    pub(crate) headers: http::HeaderMap,
    pub(crate) body: Bytes,
}

impl Answer {
    /// Reads `res` to its end.
    pub(crate) async fn read<B>(res: Response<B>) -> Self
    where
        B: http_body::Body,
        B::Error: std::fmt::Debug,
    {
        let (parts, body) = res.into_parts();
        Answer {
            version: parts.version,
            status: parts.status,
            headers: parts.headers,
            body: body.collect().await.unwrap().to_bytes(),
        }
    }

    /// Whether the layer replayed a stored response (`Idempotent-Replayed: true`; any other
    /// value of the header fails the test).
    pub(crate) fn replayed(&self) -> bool {
        match self.headers.get("idempotent-replayed") {
            Some(value) => {
                assert_eq!(value, "true", "Idempotent-Replayed is only ever `true`");
                true
            }
            None => false,
        }
    }

    /// The `type` of the layer's problem document (the answer must be one).
    pub(crate) fn problem_type(&self) -> String {
        assert_eq!(self.headers["content-type"], "application/problem+json");
        let v: serde_json::Value = serde_json::from_slice(&self.body).unwrap();
        v["type"].as_str().unwrap().to_owned()
    }

    /// The body as text.
    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Sends `req` through a clone of `svc` (a service's clones share its store) and reads the
/// answer.
pub(crate) async fn send<S, ReqBody, ResBody>(svc: &S, req: Request<ReqBody>) -> Answer
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    S::Error: std::fmt::Debug,
    ResBody: http_body::Body,
    ResBody::Error: std::fmt::Debug,
{
    use tower::ServiceExt;
    Answer::read(svc.clone().oneshot(req).await.unwrap()).await
}

/// `POST /charges` with `key` and `body` through `svc`: the status, whether it was a replay,
/// and the body as text.
pub(crate) async fn charge_through<S, ResBody>(
    svc: &S,
    key: &str,
    body: &str,
) -> (StatusCode, bool, String)
where
    S: Service<Request<Full<Bytes>>, Response = Response<ResBody>> + Clone,
    S::Error: std::fmt::Debug,
    ResBody: http_body::Body,
    ResBody::Error: std::fmt::Debug,
{
    let answer = send(svc, post("/charges", Some(key), body)).await;
    let text = String::from_utf8_lossy(&answer.body).into_owned();
    (answer.status, answer.replayed(), text)
}

/// Serves `app` with `axum::serve` on a free loopback port, on a task of its own.
pub(crate) async fn serve(app: axum::Router) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

/// A `PostgresStore` on the table `<schema>.idem`, migrated, on a pool of 8 connections to
/// the machine's Postgres.
#[cfg(feature = "postgres")]
pub(crate) async fn postgres_store(
    schema: &tower_once_test_support::postgres::Schema,
) -> tower_once_idempotency::store::postgres::PostgresStore {
    use tower_once_idempotency::store::postgres::{sqlx, PostgresStore};
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(8)
        .connect(&tower_once_test_support::postgres::database_url())
        .await
        .unwrap();
    let store = PostgresStore::new(pool)
        .table(&format!("{}.idem", schema.name))
        .unwrap();
    store.migrate().await.unwrap();
    store
}

/// A schema of its own with a `PostgresStore` and a `charges` table: what a handler that
/// charges in its own transaction writes to, and what a test counts.
#[cfg(feature = "postgres")]
pub(crate) struct ChargesDb {
    pub(crate) schema: tower_once_test_support::postgres::Schema,
    pub(crate) store: tower_once_idempotency::store::postgres::PostgresStore,
}

#[cfg(feature = "postgres")]
impl ChargesDb {
    pub(crate) async fn new() -> Self {
        use tower_once_idempotency::store::postgres::sqlx;
        let schema = tower_once_test_support::postgres::Schema::create();
        let store = postgres_store(&schema).await;
        sqlx::query(&format!(
            "CREATE TABLE {}.charges (id bigserial PRIMARY KEY, amount int8 NOT NULL)",
            schema.name
        ))
        .execute(store.pool())
        .await
        .unwrap();
        Self { schema, store }
    }

    pub(crate) fn pool(&self) -> &tower_once_idempotency::store::postgres::sqlx::PgPool {
        self.store.pool()
    }

    /// How many charges committed.
    pub(crate) async fn charges(&self) -> i64 {
        tower_once_idempotency::store::postgres::sqlx::query_scalar(&format!(
            "SELECT count(*) FROM {}.charges",
            self.schema.name
        ))
        .fetch_one(self.pool())
        .await
        .unwrap()
    }
}
