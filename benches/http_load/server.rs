//! The server side: one axum app with a bare route and the same handler behind
//! `IdempotencyLayer` on the memory store, on the Redis store and on the Postgres store.

use crate::rows::Store;
use axum::body::Bytes;
use axum::routing::post;
use axum::Router;
use http::StatusCode;
use std::net::SocketAddr;
use tower_once::idempotency::store::postgres::PostgresStore;
use tower_once::idempotency::store::redis::RedisStore;
use tower_once::idempotency::IdempotencyLayer;

/// The size of every request's JSON body.
pub(crate) const BODY_LEN: usize = 1024;

/// The route serving `store`.
pub(crate) fn path(store: Store) -> &'static str {
    match store {
        Store::None => "/bare",
        Store::Memory => "/memory",
        Store::Redis => "/redis",
        Store::Postgres => "/postgres",
    }
}

/// The handler of every route: reads the whole body and answers a small JSON document.
async fn create(body: Bytes) -> (StatusCode, [(&'static str, &'static str); 1], String) {
    (
        StatusCode::CREATED,
        [("content-type", "application/json")],
        format!(r#"{{"id":"ch_1","received":{}}}"#, body.len()),
    )
}

/// A JSON document of exactly `BODY_LEN` bytes.
pub(crate) fn json_body() -> Bytes {
    let head = r#"{"order_id":"A","amount":500,"note":""#;
    let tail = r#""}"#;
    let pad = "x".repeat(BODY_LEN - head.len() - tail.len());
    let body = format!("{head}{pad}{tail}");
    assert_eq!(body.len(), BODY_LEN);
    Bytes::from(body)
}

/// The app: one route per [`Store`].
fn app(redis: RedisStore, postgres: PostgresStore) -> Router {
    Router::new()
        .route(path(Store::None), post(create))
        .merge(
            Router::new()
                .route(path(Store::Memory), post(create))
                .route_layer(IdempotencyLayer::new()),
        )
        .merge(
            Router::new()
                .route(path(Store::Redis), post(create))
                .route_layer(IdempotencyLayer::with_store(redis)),
        )
        .merge(
            Router::new()
                .route(path(Store::Postgres), post(create))
                .route_layer(IdempotencyLayer::with_store(postgres)),
        )
}

/// Serves the app on a free loopback port, on the runtime this is called in.
pub(crate) async fn serve(redis: RedisStore, postgres: PostgresStore) -> SocketAddr {
    let app = app(redis, postgres);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let addr = listener.local_addr().expect("local address");
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}
