//! What the fallback tests share: a side (primary or secondary) that counts its calls and
//! records the key each one carried, plain services that count their calls, and the requests.

#![allow(dead_code)] // each test file uses its own part

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tower_once_core::body::BufferedBody;

pub(crate) type Req = Request<BufferedBody<Full<Bytes>>>;

/// One side: answers `status` (or fails with `error`), recording the key of every call.
#[derive(Clone, Default)]
pub(crate) struct Side {
    pub(crate) keys: Arc<Mutex<Vec<Option<String>>>>,
}

impl Side {
    pub(crate) fn calls(&self) -> usize {
        self.keys.lock().unwrap().len()
    }

    pub(crate) fn keys(&self) -> Vec<Option<String>> {
        self.keys.lock().unwrap().clone()
    }

    pub(crate) fn answering<B>(
        &self,
        status: u16,
    ) -> impl tower::Service<
        Request<B>,
        Response = Response<String>,
        Error = std::io::Error,
        Future = impl Future<Output = Result<Response<String>, std::io::Error>> + Send,
    > + Clone
           + Send
           + 'static {
        self.failing(Ok(status))
    }

    pub(crate) fn failing<B>(
        &self,
        outcome: Result<u16, std::io::ErrorKind>,
    ) -> impl tower::Service<
        Request<B>,
        Response = Response<String>,
        Error = std::io::Error,
        Future = impl Future<Output = Result<Response<String>, std::io::Error>> + Send,
    > + Clone
           + Send
           + 'static {
        let keys = self.keys.clone();
        tower::service_fn(move |req: Request<B>| {
            let key = req
                .headers()
                .get("idempotency-key")
                .map(|v| v.to_str().unwrap().to_owned());
            keys.lock().unwrap().push(key);
            async move {
                let status = outcome.map_err(std::io::Error::from)?;
                let mut res = Response::new(String::new());
                *res.status_mut() = StatusCode::from_u16(status).unwrap();
                if status == 409 {
                    res.headers_mut()
                        .insert("retry-after", "1".parse().unwrap());
                }
                Ok(res)
            }
        })
    }
}

pub(crate) fn post() -> Request<Full<Bytes>> {
    Request::post("http://a.example/charges")
        .body(Full::new(Bytes::from_static(b"{\"amount\":500}")))
        .unwrap()
}

pub(crate) fn get() -> Request<Full<Bytes>> {
    Request::get("http://a.example/balance")
        .body(Full::new(Bytes::new()))
        .unwrap()
}

/// A plain service counting its calls, answering each with `answer(n)` (n: 1 for the first).
pub(crate) fn counting<Req: Send + 'static>(
    calls: Arc<AtomicU32>,
    answer: fn(u32) -> Result<&'static str, std::io::Error>,
) -> impl tower::Service<
    Req,
    Response = &'static str,
    Error = std::io::Error,
    Future = impl Future<Output = Result<&'static str, std::io::Error>> + Send + 'static,
> + Clone
       + Send
       + 'static {
    tower::service_fn(move |_: Req| {
        let n = calls.fetch_add(1, SeqCst) + 1;
        async move { answer(n) }
    })
}

/// A plain service whose `n`th call (1 the first) waits `ms` then answers `outcome`: counts
/// the calls (the effects) as they are made.
pub(crate) fn timed<Req: Send + 'static>(
    calls: Arc<AtomicU32>,
    script: fn(u32) -> (u64, Result<&'static str, std::io::ErrorKind>),
) -> impl tower::Service<
    Req,
    Response = &'static str,
    Error = std::io::Error,
    Future = impl Future<Output = Result<&'static str, std::io::Error>> + Send + 'static,
> + Clone
       + Send
       + 'static {
    tower::service_fn(move |_: Req| {
        let n = calls.fetch_add(1, SeqCst) + 1;
        let (ms, outcome) = script(n);
        async move {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            outcome.map_err(std::io::Error::from)
        }
    })
}
