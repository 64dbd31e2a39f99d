//! What only the HTTP form does (crate docs: "the HTTP form reads the method, `SafeToRetry` and
//! the `Idempotency-Key` header"; "Semantics": "HTTP: the body is read, up to a limit"): a body
//! over the limit is never copied, so its failure stays with the primary; and `Unsent` for
//! reqwest, whose connect error after a followed redirect is not "never sent". Every test counts
//! the calls (the effects) on each side.

use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
use std::sync::Arc;
use tower::{Layer, ServiceExt};
use tower_once_fallback::http::HttpFallbackLayer;
use tower_once_fallback::FallbackLayer;

mod support;

use support::{counting, Side};

#[tokio::test(start_paused = true)]
async fn a_body_over_the_limit_goes_to_the_primary_only() {
    let (primary, secondary) = (Side::default(), Side::default());
    let big = Request::post("http://a.example/upload")
        .body(Full::new(Bytes::from(vec![b'x'; 4096])))
        .unwrap();
    let err = HttpFallbackLayer::new(secondary.answering(201))
        .side_effect_free(true)
        .body_limit(1024)
        .layer(primary.failing(Err(std::io::ErrorKind::ConnectionRefused)))
        .oneshot(big)
        .await
        .unwrap_err();
    assert!(err.is_primary());
    assert_eq!((primary.calls(), secondary.calls()), (1, 0));
}

/// A body exactly at the limit is kept; one byte over goes to the primary only.
#[tokio::test(start_paused = true)]
async fn a_body_one_byte_over_the_limit_never_reaches_the_secondary() {
    for (len, expected) in [(1024usize, 1usize), (1025, 0)] {
        let (primary, secondary) = (Side::default(), Side::default());
        let req = Request::post("http://a.example/upload")
            .body(Full::new(Bytes::from(vec![b'x'; len])))
            .unwrap();
        let _ = HttpFallbackLayer::new(secondary.answering(201))
            .body_limit(1024)
            .layer(primary.failing(Err(std::io::ErrorKind::ConnectionRefused)))
            .oneshot(req)
            .await;
        assert_eq!(secondary.calls(), expected, "{len}");
    }
}

/// `Unsent` for reqwest: "a connect error" is taken as "never sent". reqwest follows
/// redirects: a POST answered `303 See Other` (the POST ran on A) is followed by a GET to a
/// host that refuses connections; the error is a connect error, so the fallback sends the
/// POST, which ran on A, to the secondary.
#[tokio::test]
async fn a_post_that_ran_then_was_redirected_to_a_refused_host_is_not_unsent() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // A port nobody listens on.
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let closed_port = closed.local_addr().unwrap().port();
    drop(closed);
    // Provider A: runs the charge, answers 303 to a host that is down.
    let a = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let a_addr = a.local_addr().unwrap();
    let charged_on_a = Arc::new(AtomicU32::new(0));
    let count = charged_on_a.clone();
    tokio::spawn(async move {
        loop {
            let (mut sock, _) = a.accept().await.unwrap();
            let mut buf = vec![0u8; 4096];
            let mut read = 0;
            loop {
                let n = sock.read(&mut buf[read..]).await.unwrap();
                read += n;
                let text = String::from_utf8_lossy(&buf[..read]);
                if n == 0 || (text.contains("\r\n\r\n") && text.ends_with("}")) {
                    break;
                }
            }
            count.fetch_add(1, SeqCst);
            let res = format!(
                "HTTP/1.1 303 See Other\r\nLocation: http://127.0.0.1:{closed_port}/receipt\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            );
            sock.write_all(res.as_bytes()).await.unwrap();
        }
    });
    let client = reqwest::Client::new();
    let url = format!("http://{a_addr}/charges");
    let primary = tower::service_fn(move |body: String| {
        let (client, url) = (client.clone(), url.clone());
        async move { client.post(url).body(body).send().await.map(|_| "A") }
    });
    let charged_on_b = Arc::new(AtomicU32::new(0));
    let secondary = counting::<String>(charged_on_b.clone(), |_| Ok("charged by B"));
    let result = FallbackLayer::new(secondary)
        .layer(primary)
        .oneshot("{\"amount\":500}".to_owned())
        .await;
    assert_eq!(charged_on_a.load(SeqCst), 1, "{result:?}");
    assert_eq!(
        charged_on_b.load(SeqCst),
        0,
        "the POST ran on A (303), and again on B: {result:?}"
    );
}
