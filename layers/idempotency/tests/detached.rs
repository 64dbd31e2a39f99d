//! Waiting for detached work at shutdown (the `Detached` docs; `shutdown_signal` docs
//! and the row "the client went away ... at shutdown, `layer.detached().wait()` after the server
//! stopped lets such handlers finish"): after a graceful shutdown, `wait()` returns only once every
//! handler whose client left and every background store write of the layer has finished, so a
//! rolling deploy never cuts the work that makes a client's retry a replay.
//!
//! Real axum servers on loopback, each in a runtime of its own (a process: dropping the runtime is
//! the process exiting). The store is a `MemoryStore` that outlives them (it stands for Redis),
//! behind a wrapper that makes its completions slow, as a loaded network store is.

use axum::routing::post;
use axum::Router;
use bytes::Bytes;
use http::Request;
use http::StatusCode;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tower_once_idempotency::fingerprint::Fingerprint;
use tower_once_idempotency::store::{
    ClaimToken, Completion, IdempotencyStore, MemoryStore, StoreError, StoreKey,
};
use tower_once_idempotency::IdempotencyLayer;

type Boxed<T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send>>;

/// A store whose completions take `delay` to land (claims, releases and renewals are quick).
#[derive(Clone)]
struct SlowCompletions {
    inner: MemoryStore,
    delay: Duration,
    /// A completion has been sent.
    sent: Arc<AtomicBool>,
    /// A completion has landed in the store.
    landed: Arc<AtomicBool>,
}

impl IdempotencyStore for SlowCompletions {
    type ClaimFuture = <MemoryStore as IdempotencyStore>::ClaimFuture;
    type CompleteFuture = Boxed<bool>;
    type ReleaseFuture = <MemoryStore as IdempotencyStore>::ReleaseFuture;
    type ExtendFuture = <MemoryStore as IdempotencyStore>::ExtendFuture;

    fn claim(
        &self,
        key: StoreKey,
        token: ClaimToken,
        fp: Fingerprint,
        lease: Duration,
    ) -> Self::ClaimFuture {
        self.inner.claim(key, token, fp, lease)
    }

    fn complete(
        &self,
        key: StoreKey,
        token: ClaimToken,
        completion: Completion,
        retention: Duration,
    ) -> Self::CompleteFuture {
        let this = self.clone();
        Box::pin(async move {
            this.sent.store(true, SeqCst);
            tokio::time::sleep(this.delay).await;
            let done = this.inner.complete(key, token, completion, retention).await;
            this.landed.store(true, SeqCst);
            done
        })
    }

    fn release(&self, key: StoreKey, token: ClaimToken) -> Self::ReleaseFuture {
        self.inner.release(key, token)
    }

    fn extend(&self, key: StoreKey, token: ClaimToken, lease: Duration) -> Self::ExtendFuture {
        self.inner.extend(key, token, lease)
    }
}

/// A charge handler that counts its runs, behind the layer.
fn app<St: IdempotencyStore>(
    store: St,
    runs: Arc<AtomicUsize>,
) -> (Router, tower_once_idempotency::Detached) {
    // NOTE: a lease longer than the slow completion: a completion that lands after the lease ran
    // out is refused (fenced), which is what the lease docs warn of.
    let layer = IdempotencyLayer::with_store(store).lease(Duration::from_millis(1500));
    let detached = layer.detached();
    let router = Router::new()
        .route(
            "/charges",
            post(move || {
                runs.fetch_add(1, SeqCst);
                async { (StatusCode::CREATED, "charged") }
            }),
        )
        .layer(layer);
    (router, detached)
}

const CHARGE: &[u8] = b"POST /charges HTTP/1.1\r\nhost: x\r\nidempotency-key: deploy-1\r\n\
content-type: application/json\r\ncontent-length: 2\r\n\r\n{}";

/// A client that gives up while the layer is storing its response (the handler ran; the completion
/// is on its way to a slow store) drops the request's future; the write then finishes on a task
/// `Detached` counts, so a graceful shutdown followed by `detached.wait()` waits for it and the
/// client's retry after the deploy is a replay. Was broken: the `ClaimGuard` finished the write on
/// a bare `Handle::spawn`, `wait()` returned at once, the process exited, the write was lost, and
/// once the lease ran out the retry ran the handler a second time.
#[test]
fn wait_after_shutdown_covers_a_completion_whose_client_left() {
    let memory = MemoryStore::new();
    let store = SlowCompletions {
        inner: memory.clone(),
        delay: Duration::from_millis(700),
        sent: Arc::default(),
        landed: Arc::default(),
    };
    let runs = Arc::new(AtomicUsize::new(0));

    // The first process: it charges, starts storing the answer, and is deployed away.
    let first = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (waited, landed_when_waited) = first.block_on({
        let (store, runs) = (store.clone(), runs.clone());
        async move {
            let (router, detached) = app(store.clone(), runs.clone());
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let server = tokio::spawn(async move {
                axum::serve(listener, router)
                    .with_graceful_shutdown(async {
                        let _ = stopped.await;
                    })
                    .await
            });
            let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
            conn.write_all(CHARGE).await.unwrap();
            // Bounded: the handler ran and the layer sent its completion.
            for _ in 0..400 {
                if store.sent.load(SeqCst) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            assert!(store.sent.load(SeqCst), "the completion was sent");
            assert_eq!(runs.load(SeqCst), 1);
            // The client's own timeout: it leaves before the (slow) answer.
            drop(conn);
            tokio::time::sleep(Duration::from_millis(100)).await;
            let _ = stop.send(()); // SIGTERM
            let _ = tokio::time::timeout(Duration::from_secs(10), server).await;
            // What a graceful shutdown does after the server stopped (`shutdown_signal` docs,
            // `Detached`).
            let waited = tokio::time::timeout(Duration::from_secs(10), detached.wait())
                .await
                .is_ok();
            (waited, store.landed.load(SeqCst))
        }
    });
    drop(first); // the process exits
    assert!(waited, "wait() returned within 10 s");

    // The next process, on the same store: the client retries once the lease has run out.
    let second = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let answer = second.block_on({
        let runs = runs.clone();
        async move {
            tokio::time::sleep(Duration::from_millis(1600)).await; // past the lease
            let (router, _) = app(memory, runs);
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            tokio::spawn(async move { axum::serve(listener, router).await });
            let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
            conn.write_all(CHARGE).await.unwrap();
            let mut head = vec![0u8; 4096];
            let n = tokio::time::timeout(Duration::from_secs(10), conn.read(&mut head))
                .await
                .expect("an answer within 10 s")
                .unwrap();
            String::from_utf8_lossy(&head[..n]).into_owned()
        }
    });
    drop(second);
    assert_eq!(
        runs.load(SeqCst),
        1,
        "the handler ran once across the deploy (the completion landed before wait() \
         returned: {landed_when_waited}); the retry got {answer:?}"
    );
    assert!(
        answer
            .to_ascii_lowercase()
            .contains("idempotent-replayed: true"),
        "the retry after the deploy is a replay: {answer:?}"
    );
}

/// Was broken: the task that finishes a handler whose client left was invisible to axum's
/// graceful shutdown: it waits for connections, there were none left, the process ended and
/// the handler was dropped half-way. Now the layer counts such tasks
/// (`IdempotencyLayer::detached`) and the shutdown waits for them after the server stopped.
#[test]
fn graceful_shutdown_waits_for_a_detached_handler() {
    assert_eq!(
        shutdown_during_handler(true),
        1,
        "the detached handler was dropped half-way by a graceful shutdown"
    );
}

/// The same shutdown while the client is still connected waits for the
/// handler, which finishes.
#[test]
fn graceful_shutdown_waits_for_an_attached_handler() {
    assert_eq!(shutdown_during_handler(false), 1);
}

fn shutdown_during_handler(client_leaves: bool) -> usize {
    let started = Arc::new(AtomicUsize::new(0));
    let finished = Arc::new(AtomicUsize::new(0));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (s, f) = (started.clone(), finished.clone());
    rt.block_on(async move {
        let layer = IdempotencyLayer::new();
        let detached = layer.detached();
        let app = Router::new()
            .route(
                "/charges",
                post(move || {
                    let (s, f) = (s.clone(), f.clone());
                    async move {
                        s.fetch_add(1, SeqCst);
                        tokio::time::sleep(Duration::from_millis(800)).await;
                        f.fetch_add(1, SeqCst); // the effect's second half
                        (StatusCode::CREATED, "charged")
                    }
                }),
            )
            .layer(layer);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = stopped.await;
                })
                .await
        });
        let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
        let req = Request::post(format!("http://{addr}/charges"))
            .header("idempotency-key", "deploy")
            .body(Full::new(Bytes::from_static(b"{}")))
            .unwrap();
        let request = tokio::spawn(client.request(req));
        for _ in 0..200 {
            if started.load(SeqCst) == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(started.load(SeqCst), 1);
        if client_leaves {
            request.abort(); // the client times out and leaves
            let _ = request.await;
            drop(client);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        let _ = stop.send(()); // a rolling deploy
        let _ = tokio::time::timeout(Duration::from_secs(5), server).await;
        // What a graceful shutdown does after the server stopped (see `Detached`).
        let _ = tokio::time::timeout(Duration::from_secs(5), detached.wait()).await;
    });
    drop(rt); // main returns
    finished.load(SeqCst)
}
