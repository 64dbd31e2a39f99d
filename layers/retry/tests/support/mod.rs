//! What the retry crate's test files share.

#![allow(dead_code)] // each test file uses its own part

use tower::{Service, ServiceExt};

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
