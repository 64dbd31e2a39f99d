//! The `idempotency` span's name and fields (crate docs "Observability"; facade crate docs
//! "Metrics") are a stable interface for dashboards and log queries. This test has its own binary:
//! tracing caches callsite interest process-wide, so a thread-local subscriber is only reliable
//! when no other test runs beside it.

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use tower::{Layer, Service, ServiceExt};
use tower_once_idempotency::{IdempotencyLayer, RequestBody};

#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn spans_carry_stable_fields_and_outcomes() {
    let capture = Capture::default();
    let writer = capture.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_span_events(tracing_subscriber::fmt::format::FmtSpan::CLOSE)
        .with_max_level(tracing::Level::DEBUG)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let handler = tower::service_fn(|req: Request<RequestBody<Full<Bytes>>>| async move {
        let status = if req.uri().query() == Some("fail") {
            503
        } else {
            201
        };
        let mut res = Response::new(Full::new(Bytes::from_static(b"ok")));
        *res.status_mut() = StatusCode::from_u16(status).unwrap();
        Ok::<_, Infallible>(res)
    });
    let mut svc = IdempotencyLayer::new().layer(handler);
    for (uri, key, body) in [
        ("/charges", "k", "x"),
        ("/charges", "k", "x"),
        ("/charges", "k", "other"),
        ("/charges?fail", "k2", "x"),
        ("/charges", "bad key", "x"),
    ] {
        let req = Request::post(uri)
            .header("idempotency-key", key)
            .body(Full::new(Bytes::from_static(body.as_bytes())))
            .unwrap();
        let res = svc.ready().await.unwrap().call(req).await.unwrap();
        res.into_body().collect().await.unwrap();
    }

    let logs = String::from_utf8(capture.0.lock().unwrap().clone()).unwrap();
    let closes: Vec<&str> = logs.lines().filter(|l| l.contains(" close ")).collect();
    assert_eq!(
        closes.len(),
        4,
        "one span per covered, well-formed request:\n{logs}"
    );
    for (line, outcome) in closes
        .iter()
        .zip(["stored", "replayed", "mismatch", "released"])
    {
        assert!(line.contains("idempotency{"), "{line}");
        assert!(
            line.contains("method=POST") && line.contains("path=\"/charges\""),
            "{line}"
        );
        assert!(line.contains("store_key="), "{line}");
        assert!(line.contains(&format!("outcome=\"{outcome}\"")), "{line}");
    }
    assert!(
        logs.contains("outcome=\"rejected\""),
        "malformed keys are logged as rejected"
    );
    assert!(
        !logs.contains("bad key"),
        "raw keys are never logged:\n{logs}"
    );
}
