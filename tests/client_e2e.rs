//! The demo client (examples/README.md: `RetryLayer` + `HttpTimeoutLayer` over hyper-util,
//! each retry printed on stderr, one generated `Idempotency-Key` on every attempt of a `POST`, exit
//! 0 on a 2xx) as a real process against the demo server, end to end.
#![cfg(feature = "retry")]

#[allow(dead_code)]
#[path = "../examples/server/app.rs"]
mod app;
mod support;

use std::net::SocketAddr;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A loopback proxy that forwards every request, but for the first `drop` connections waits
/// until the server has started answering (so it did the work) and then hangs up on the client
/// instead of passing the answer back.
async fn lossy_proxy(upstream: SocketAddr, drop: usize) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let connections = Arc::new(AtomicUsize::new(0));
    let count = connections.clone();
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            let n = count.fetch_add(1, SeqCst);
            tokio::spawn(async move {
                let Ok(mut server) = TcpStream::connect(upstream).await else {
                    return;
                };
                if n >= drop {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    return;
                }
                let (mut client_read, _client_write) = client.split();
                let (mut server_read, mut server_write) = server.split();
                let forward = tokio::io::copy(&mut client_read, &mut server_write);
                let mut first_byte = [0u8; 1];
                tokio::select! {
                    _ = forward => {}
                    _ = server_read.read_exact(&mut first_byte) => {}
                }
                // The response began: the handler ran. Drop the client without it.
                let _ = server_write.shutdown().await;
            });
        }
    });
    (addr, connections)
}

/// The demo charge server (memory store, memory ledger) on a loopback port.
async fn demo_server() -> (SocketAddr, app::Ledger) {
    let ledger = app::Ledger::memory();
    let router = app::router(
        tower_once::idempotency::store::MemoryStore::new(),
        Duration::from_secs(10),
        ledger.clone(),
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await });
    (server, ledger)
}

fn run_client(args: &[&str]) -> (bool, String, String, Duration) {
    let started = Instant::now();
    let output = Command::new(support::example_binary("client"))
        .args(args)
        .output()
        .expect("run the demo client");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
        started.elapsed(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_responses_are_retried_and_charged_exactly_once() {
    let (server, ledger) = demo_server().await;
    let (proxy, connections) = lossy_proxy(server, 2).await;

    let url = format!("http://{proxy}/charges");
    let (ok, stdout, stderr, _) = tokio::task::spawn_blocking(move || {
        run_client(&[
            &url,
            "--data",
            r#"{"order_id":"A","amount":500}"#,
            "--backoff-ms",
            "50",
            "--seed",
            "1",
        ])
    })
    .await
    .unwrap();

    assert!(
        ok,
        "the client ended with a 2xx\nstdout: {stdout}\nstderr: {stderr}"
    );
    assert!(
        stdout.starts_with("201 Created (replayed)"),
        "the last answer is a replay: {stdout}"
    );
    assert_eq!(
        stderr.matches("retry: attempt").count(),
        2,
        "two lost responses, two retries:\n{stderr}"
    );
    assert_eq!(connections.load(SeqCst), 3);
    let charges = ledger.charges().await.unwrap();
    assert_eq!(charges.len(), 1, "three deliveries, one charge");
    assert!(
        stdout.contains(&charges[0].charge_id),
        "the replay is the first charge's answer"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_server_is_cut_by_the_timeout_and_the_deadline() {
    // Accepts, reads, never answers; counts requests.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let requests = Arc::new(AtomicUsize::new(0));
    let count = requests.clone();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            count.fetch_add(1, SeqCst);
            tokio::spawn(async move {
                let mut sink = vec![0u8; 4096];
                while matches!(socket.read(&mut sink).await, Ok(n) if n > 0) {}
            });
        }
    });

    let url = format!("http://{addr}/slow");
    let (ok, _, stderr, took) = tokio::task::spawn_blocking(move || {
        run_client(&[
            &url,
            "--timeout-ms",
            "200",
            "--deadline-ms",
            "1000",
            "--max-attempts",
            "10",
            "--seed",
            "7",
        ])
    })
    .await
    .unwrap();

    assert!(!ok);
    let attempts = requests.load(SeqCst);
    let retries = stderr.matches("retry: attempt").count();
    assert_eq!(
        attempts,
        retries + 1,
        "every attempt reached the server once:\n{stderr}"
    );
    assert!(
        (2..=5).contains(&attempts),
        "only the attempts that fit in 1 s ({attempts}):\n{stderr}"
    );
    assert!(
        stderr.contains("(deadline)"),
        "it stopped for the deadline:\n{stderr}"
    );
    assert!(
        took < Duration::from_secs(3),
        "returned in about a second, not after 10 attempts: {took:?}"
    );
}

/// A loopback proxy whose first connection is slow: it waits `delay` before passing anything
/// on (a slow network path). Counts connections that reached the server.
async fn slow_first_proxy(upstream: SocketAddr, delay: Duration) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let forwarded = Arc::new(AtomicUsize::new(0));
    let count = forwarded.clone();
    tokio::spawn(async move {
        let mut n = 0;
        while let Ok((mut client, _)) = listener.accept().await {
            let slow = n == 0;
            n += 1;
            let count = count.clone();
            tokio::spawn(async move {
                if slow {
                    tokio::time::sleep(delay).await;
                }
                let Ok(mut server) = TcpStream::connect(upstream).await else {
                    return;
                };
                count.fetch_add(1, SeqCst);
                let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
            });
        }
    });
    (addr, forwarded)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hedge_with_the_same_key_cuts_a_slow_path_and_charges_once() {
    let (server, ledger) = demo_server().await;
    let (proxy, forwarded) = slow_first_proxy(server, Duration::from_secs(2)).await;

    let url = format!("http://{proxy}/charges");
    let (ok, stdout, stderr, took) = tokio::task::spawn_blocking(move || {
        run_client(&[
            &url,
            "--data",
            r#"{"order_id":"H","amount":700}"#,
            "--hedge-after-ms",
            "100",
        ])
    })
    .await
    .unwrap();
    assert!(ok, "stdout: {stdout}\nstderr: {stderr}");
    assert!(stdout.starts_with("201 Created"), "{stdout}");
    assert_eq!(
        stderr.matches("send: request").count(),
        2,
        "the first request and one hedge:\n{stderr}"
    );
    assert!(
        took < Duration::from_millis(1500),
        "the hedge answered, not the slow path: {took:?}"
    );
    // The slow copy reaches the server later, with the same key: a replay, not a charge.
    let waited = Instant::now();
    while forwarded.load(SeqCst) < 2 {
        assert!(
            waited.elapsed() < Duration::from_secs(10),
            "the slow copy never arrived"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let charges = ledger.charges().await.unwrap();
    assert_eq!(charges.len(), 1, "two copies, one charge");
}
