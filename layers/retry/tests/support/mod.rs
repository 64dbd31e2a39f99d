//! What the retry crate's test files share: calls on many threads, a fixed backoff, a scripted
//! HTTP upstream and a plain `GET`.

#![allow(dead_code)] // each test file uses its own part

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;
use tower::{Service, ServiceExt};
use tower_once_retry::backoff::{Backoff, Jitter};

/// Runs `calls` calls of `service(thread)` on each of `threads` OS threads, each with a tokio
/// runtime of its own (so each thread reaches its own copy of a layer's per-thread settings),
/// and waits for all of them. Outcomes are ignored: tests read the layer's counters.
pub(crate) fn calls_on_threads<S>(threads: usize, calls: usize, service: impl Fn(usize) -> S)
where
    S: Service<u32> + Clone + Send + 'static,
    S::Future: Send,
{
    let handles: Vec<_> = (0..threads)
        .map(|thread| {
            let svc = service(thread);
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async move {
                    for _ in 0..calls {
                        let _ = svc.clone().oneshot(1).await;
                    }
                });
            })
        })
        .collect();
    handles.into_iter().for_each(|t| t.join().unwrap());
}

/// A fixed 100 ms wait between attempts, no jitter.
pub(crate) fn fixed(ms: u64) -> Backoff {
    Backoff::new(Duration::from_millis(ms), 1.0, Duration::from_millis(ms))
        .unwrap()
        .jitter(Jitter::None)
}

/// An HTTP upstream: each call answers the next `(status, Retry-After)` (the last repeats);
/// status 0 hangs.
pub(crate) fn http_upstream<B: Send + 'static>(
    script: &'static [(u16, Option<&'static str>)],
    calls: Arc<AtomicUsize>,
) -> impl Service<Request<B>, Response = Response<Full<Bytes>>, Error = Infallible, Future = impl Send>
       + Clone
       + Send
       + 'static {
    tower::service_fn(move |_req: Request<B>| {
        let n = calls.fetch_add(1, SeqCst);
        let (status, after) = script[n.min(script.len() - 1)];
        async move {
            if status == 0 {
                std::future::pending::<()>().await;
            }
            let mut res = Response::new(Full::new(Bytes::new()));
            *res.status_mut() = StatusCode::from_u16(status).unwrap();
            if let Some(after) = after {
                res.headers_mut()
                    .insert("retry-after", after.parse().unwrap());
            }
            Ok::<_, Infallible>(res)
        }
    })
}

pub(crate) fn get() -> Request<Full<Bytes>> {
    Request::get("/x").body(Full::new(Bytes::new())).unwrap()
}
