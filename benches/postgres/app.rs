//! The app under test: one axum router with a route per [`Route`], the tables its handlers
//! write (in the bench's own schema), and the records the replay rows read.

use crate::rows::Route;
use axum::body::Body;
use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgConnection, PgPool};
use std::sync::Arc;
use std::time::Duration;
use tower_once::idempotency::store::postgres::{sqlx, PostgresStore};
use tower_once::idempotency::store::redis::RedisStore;
use tower_once::idempotency::{Claim, IdempotencyLayer, IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED};

/// The route serving `route`.
pub(crate) fn path(route: Route) -> &'static str {
    match route {
        Route::Effect => "/effect",
        Route::HandDedupe => "/hand/dedupe",
        Route::HandSelect => "/hand/select",
        Route::Memory => "/memory",
        Route::Redis => "/redis",
        Route::PostgresPlain => "/postgres/plain",
        Route::PostgresRespondIn => "/postgres/respond-in",
        Route::PostgresTransactional => "/postgres/transactional",
    }
}

/// Every statement the handlers run, rendered once for the bench's schema.
#[derive(Debug)]
struct Sql {
    effect: String,
    dedupe: String,
    select: String,
}

/// What every handler shares.
#[derive(Clone, Debug)]
struct Handlers {
    pool: PgPool,
    sql: Arc<Sql>,
}

/// A failed statement, as the handler answers it.
fn unavailable(error: sqlx::Error) -> Response {
    (StatusCode::SERVICE_UNAVAILABLE, error.to_string()).into_response()
}

/// Every handler's answer to a new request: the effect's id, as a small JSON document.
fn created(id: i64) -> Response {
    (
        StatusCode::CREATED,
        [(CONTENT_TYPE, "application/json")],
        format!(r#"{{"id":{id}}}"#),
    )
        .into_response()
}

/// The request's idempotency key, or the answer to a request without one.
fn key(headers: &HeaderMap) -> Result<&str, StatusCode> {
    headers
        .get(IDEMPOTENCY_KEY)
        .and_then(|key| key.to_str().ok())
        .ok_or(StatusCode::BAD_REQUEST)
}

impl Handlers {
    /// The effect: one small row, its id returned.
    async fn insert_effect(&self, connection: &mut PgConnection) -> Result<i64, Response> {
        sqlx::query_scalar(&self.sql.effect)
            .bind(5_i64)
            .fetch_one(connection)
            .await
            .map_err(unavailable)
    }
}

/// `Route::Effect`, and the handler behind every layer that completes the record itself.
async fn effect(State(h): State<Handlers>) -> Result<Response, Response> {
    let mut tx = h.pool.begin().await.map_err(unavailable)?;
    let id = h.insert_effect(&mut tx).await?;
    tx.commit().await.map_err(unavailable)?;
    Ok(created(id))
}

/// `Route::HandDedupe`: the key and the effect in one transaction; a duplicate is refused.
async fn hand_dedupe(State(h): State<Handlers>, headers: HeaderMap) -> Result<Response, Response> {
    let key = key(&headers).map_err(IntoResponse::into_response)?;
    let mut tx = h.pool.begin().await.map_err(unavailable)?;
    let inserted = sqlx::query(&h.sql.dedupe)
        .bind(key)
        .execute(&mut *tx)
        .await
        .map_err(unavailable)?
        .rows_affected();
    if inserted == 0 {
        return Err((StatusCode::CONFLICT, "duplicate").into_response());
    }
    let id = h.insert_effect(&mut tx).await?;
    tx.commit().await.map_err(unavailable)?;
    Ok(created(id))
}

/// `Route::HandSelect`: the stored response of the key, marked as a replay as the layer marks
/// one.
async fn hand_select(State(h): State<Handlers>, headers: HeaderMap) -> Result<Response, Response> {
    let key = key(&headers).map_err(IntoResponse::into_response)?;
    let (status, names, values, body): (i16, Vec<String>, Vec<Vec<u8>>, Vec<u8>) =
        sqlx::query_as(&h.sql.select)
            .bind(key)
            .fetch_one(&h.pool)
            .await
            .map_err(unavailable)?;
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = StatusCode::from_u16(u16::try_from(status).unwrap_or(500))
        .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    for (name, value) in names.iter().zip(values) {
        let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_bytes(&value),
        ) else {
            return Err((StatusCode::INTERNAL_SERVER_ERROR, "bad stored header").into_response());
        };
        response.headers_mut().append(name, value);
    }
    response
        .headers_mut()
        .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    Ok(response)
}

/// `Route::PostgresRespondIn`: the effect and the record in the handler's transaction.
async fn respond_in(
    State(h): State<Handlers>,
    claim: Claim<PostgresStore>,
) -> Result<Response, Response> {
    let mut tx = h.pool.begin().await.map_err(unavailable)?;
    let id = h.insert_effect(&mut tx).await?;
    let response = claim
        .respond_in(&mut tx, created(id))
        .await
        .map_err(IntoResponse::into_response)?;
    tx.commit().await.map_err(unavailable)?;
    Ok(response)
}

/// `Route::PostgresTransactional`: the effect on the claim's transaction, committed with the
/// record.
async fn transactional(
    State(h): State<Handlers>,
    claim: Claim<PostgresStore>,
) -> Result<Response, Response> {
    let mut tx = claim
        .transaction()
        .await
        .map_err(IntoResponse::into_response)?;
    let id = h.insert_effect(&mut tx).await?;
    claim
        .commit(tx, created(id))
        .await
        .map_err(IntoResponse::into_response)
}

/// The app and what the bench reads beside it.
#[derive(Debug)]
pub(crate) struct App {
    pub(crate) router: Router,
    pub(crate) pool: PgPool,
    /// The `application_name` of the pool's connections, to find their backends.
    pub(crate) application_name: String,
    schema: String,
}

impl App {
    /// Connects a pool of `connections` (all opened at once, and kept) to `url`, creates the
    /// tables in `schema`, and builds the router, whose layers share that pool and `redis`.
    pub(crate) async fn start(
        url: &str,
        schema: &str,
        connections: u32,
        redis: RedisStore,
    ) -> Self {
        let application_name = format!("tower_once_bench_{}", std::process::id());
        let options: PgConnectOptions = url.parse().expect("a valid DATABASE_URL");
        let pool = PgPoolOptions::new()
            .max_connections(connections)
            .min_connections(connections)
            .acquire_timeout(Duration::from_secs(5))
            .connect_with(options.application_name(&application_name))
            .await
            .expect("connect to PostgreSQL");
        let store = PostgresStore::new(pool.clone())
            .table(&format!("{schema}.idem"))
            .expect("a valid table name");
        store.migrate().await.expect("create the records table");
        sqlx::raw_sql(&format!(
            "CREATE TABLE {schema}.effects (id bigserial PRIMARY KEY, amount int8 NOT NULL);
             CREATE TABLE {schema}.dedupe (key text PRIMARY KEY);
             CREATE TABLE {schema}.responses (key text PRIMARY KEY, status int2 NOT NULL,
                 header_names text[] NOT NULL, header_values bytea[] NOT NULL,
                 body bytea NOT NULL);"
        ))
        .execute(&pool)
        .await
        .expect("create the handlers' tables");
        let handlers = Handlers {
            pool: pool.clone(),
            sql: Arc::new(Sql {
                effect: format!("INSERT INTO {schema}.effects (amount) VALUES ($1) RETURNING id"),
                dedupe: format!(
                    "INSERT INTO {schema}.dedupe (key) VALUES ($1) ON CONFLICT DO NOTHING"
                ),
                select: format!(
                    "SELECT status, header_names, header_values, body FROM {schema}.responses \
                     WHERE key = $1"
                ),
            }),
        };
        let router = Router::new()
            .route(path(Route::Effect), post(effect))
            .route(path(Route::HandDedupe), post(hand_dedupe))
            .route(path(Route::HandSelect), post(hand_select))
            .merge(
                Router::new()
                    .route(path(Route::Memory), post(effect))
                    .route_layer(IdempotencyLayer::new()),
            )
            .merge(
                Router::new()
                    .route(path(Route::Redis), post(effect))
                    .route_layer(IdempotencyLayer::with_store(redis)),
            )
            .merge(
                Router::new()
                    .route(path(Route::PostgresPlain), post(effect))
                    .route(path(Route::PostgresRespondIn), post(respond_in))
                    .route_layer(IdempotencyLayer::with_store(store.clone())),
            )
            .merge(
                Router::new()
                    .route(path(Route::PostgresTransactional), post(transactional))
                    .route_layer(IdempotencyLayer::with_store(store.transactional())),
            )
            .with_state(handlers.clone());
        Self {
            router,
            pool,
            application_name,
            schema: schema.to_owned(),
        }
    }

    /// Stores, for the hand-written replay, the response a new request gets (with the same
    /// headers the layer keeps: the content type) under each of `keys`.
    pub(crate) async fn store_responses(&self, keys: &[String]) {
        let insert = format!(
            "INSERT INTO {}.responses (key, status, header_names, header_values, body) \
             VALUES ($1, 201, ARRAY['content-type'], ARRAY['application/json'::bytea], $2)",
            self.schema
        );
        for key in keys {
            sqlx::query(&insert)
                .bind(key)
                .bind(br#"{"id":1}"#.as_slice())
                .execute(&self.pool)
                .await
                .expect("store a response");
        }
    }
}
