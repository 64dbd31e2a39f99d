//! Before the first round: complete the replay keys on every store.

use super::{request, HttpTarget};
use crate::rows::COVERED;
use crate::server;
use http::{HeaderValue, StatusCode};
use http_body_util::BodyExt;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// Sends each replay key once to each covered store's route, on one connection, so every replay
/// row finds them completed. Answers how many were created (every one, when all went well).
pub(crate) async fn complete_replay_keys(target: HttpTarget) -> usize {
    let stream = TcpStream::connect(target.addr).await.expect("connect");
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(connection);
    let host =
        HeaderValue::from_str(&target.addr.to_string()).expect("an address is a valid header");
    let mut created = 0;
    for &store in COVERED {
        for key in target.replay_keys.iter() {
            sender.ready().await.expect("connection open");
            let request = request(
                host.clone(),
                server::path(store),
                key.clone(),
                target.body.clone(),
            );
            let response = sender.send_request(request).await.expect("warm-up request");
            if response.status() == StatusCode::CREATED {
                created += 1;
            }
            response.into_body().collect().await.expect("warm-up body");
        }
    }
    created
}
