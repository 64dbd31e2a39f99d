//! `shutdown_signal()` (crate docs; `shutdown_signal` docs): SIGTERM, what containers are
//! stopped with, and SIGINT both stop a process gracefully. Real processes: the demo server
//! example, and this test binary run again as a child. Every wait is a bounded poll; nothing
//! asserts on timing.
#![cfg(all(unix, feature = "signal"))]

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use tower_once_test_support::ports::{free_port, wait_for_port};

const LIMIT: Duration = Duration::from_secs(30);

/// Sends `signal` (`TERM`, `INT`) to `child`.
fn send(child: &Child, signal: &str) {
    let status = Command::new("kill")
        .args([&format!("-{signal}"), &child.id().to_string()])
        .status()
        .expect("run kill");
    assert!(status.success());
}

/// Waits (bounded) for `child` to exit.
fn exit_of(child: &mut Child) -> ExitStatus {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            return status;
        }
        if started.elapsed() > LIMIT {
            let _ = child.kill();
            panic!("no exit within {LIMIT:?} of the signal");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Every line `reader` gives, on a channel, read to its end on a thread of its own (so the
/// child never blocks on a full pipe).
fn lines(reader: impl std::io::Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(reader).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    rx
}

/// Waits (bounded) for a line containing `needle`.
fn wait_for_line(lines: &mpsc::Receiver<String>, needle: &str) {
    let deadline = Instant::now() + LIMIT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) if line.contains(needle) => return,
            Ok(_) => {}
            Err(e) => panic!("no line with {needle:?}: {e}"),
        }
    }
}

#[test]
fn sigterm_lets_the_demo_server_finish_the_request_in_flight_and_exit_0() {
    let port = free_port();
    let mut server = Command::new(support::server_binary())
        .args(["--addr", &format!("127.0.0.1:{port}")])
        // The layer's debug line says when the handler has the key: the request is in flight.
        .env("RUST_LOG", "tower_once_idempotency=debug")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the demo server");
    let log = lines(server.stderr.take().expect("piped stderr"));
    wait_for_port(port, LIMIT);

    let url = format!("http://127.0.0.1:{port}/charges?delay_ms=2000");
    let client = std::thread::spawn(move || {
        support::http(
            "POST",
            &url,
            &[("Idempotency-Key", "stop-1")],
            r#"{"order_id":"A","amount":500}"#,
        )
    });
    wait_for_line(&log, "claimed idempotency key");
    send(&server, "TERM");

    let (status, body) = client.join().expect("the client thread");
    assert_eq!(status, 201, "the request in flight finished: {body}");
    assert!(body.contains(r#""charge_id":"ch_000001""#), "{body}");
    let exit = exit_of(&mut server);
    assert_eq!(exit.code(), Some(0), "a graceful stop: {exit}");
}

/// Run as a child by the test below (with `TOWER_ONCE_SIGNAL_CHILD` set): waits for the
/// signal, then says so and returns, so the process exits 0. Without the variable: nothing.
#[test]
fn child_waiting_for_shutdown() {
    if std::env::var_os("TOWER_ONCE_SIGNAL_CHILD").is_none() {
        return;
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let signal = tower_once::shutdown_signal();
        // Installed: a signal from now on is caught, even before the first poll.
        println!("child ready");
        signal.await;
        println!("child stopping");
    });
}

#[test]
fn shutdown_signal_resolves_on_sigterm_and_on_sigint() {
    for signal in ["TERM", "INT"] {
        let mut child = Command::new(std::env::current_exe().expect("this test binary"))
            .args(["--exact", "child_waiting_for_shutdown", "--nocapture"])
            .env("TOWER_ONCE_SIGNAL_CHILD", "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the child");
        let out = lines(child.stdout.take().expect("piped stdout"));
        wait_for_line(&out, "child ready");
        send(&child, signal);
        wait_for_line(&out, "child stopping");
        let exit = exit_of(&mut child);
        assert_eq!(exit.code(), Some(0), "SIG{signal}: {exit}");
    }
}
