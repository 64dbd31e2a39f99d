//! What the workspace's tests share beyond `tower-once-test-support`: the example binaries
//! built with this package's features, the demo server as a process, a blocking HTTP/1.1
//! exchange, the pipeline example's processes, and the fake payments API the agent example calls.
#![allow(dead_code)] // each test binary uses part of this module

pub(crate) mod payments;
pub(crate) mod pipeline;

use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use tower_once_test_support::examples;
use tower_once_test_support::ports::{free_port, wait_for_port};

/// An example binary (`examples/<name>`), which `cargo test` builds beside the tests.
pub(crate) fn example_binary(name: &str) -> PathBuf {
    example_binary_with(name, "redis retry postgres")
}

/// [`example_binary`] for an example that needs other features to build.
pub(crate) fn example_binary_with(name: &str, features: &str) -> PathBuf {
    examples::example_binary(name, features)
}

/// The demo server binary.
pub(crate) fn server_binary() -> PathBuf {
    example_binary("server")
}

/// A running demo server process.
pub(crate) struct DemoServer {
    pub(crate) port: u16,
    child: Option<Child>,
}

impl DemoServer {
    pub(crate) fn start(args: &[&str]) -> Self {
        let port = free_port();
        let child = Command::new(server_binary())
            .args(["--addr", &format!("127.0.0.1:{port}")])
            .args(args)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the demo server");
        wait_for_port(port, Duration::from_secs(20));
        Self {
            port,
            child: Some(child),
        }
    }

    pub(crate) fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Sends `signal` (`STOP`, `CONT`, ...) with `kill`.
    pub(crate) fn signal(&self, signal: &str) {
        if let Some(child) = &self.child {
            let status = Command::new("kill")
                .args([&format!("-{signal}"), &child.id().to_string()])
                .status()
                .expect("run kill");
            assert!(status.success(), "kill -{signal}");
        }
    }

    /// SIGKILL: the process dies mid-request, with no chance to release anything.
    pub(crate) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for DemoServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A blocking HTTP/1.1 exchange on loopback (`Connection: close`): status and body. Enough for
/// process tests that must not share a runtime with what they test.
pub(crate) fn http(method: &str, url: &str, headers: &[(&str, &str)], body: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let rest = url.strip_prefix("http://").expect("an http:// URL");
    let (host, path) = rest
        .split_once('/')
        .map_or((rest, "/".to_owned()), |(h, p)| (h, format!("/{p}")));
    let mut stream = TcpStream::connect(host).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("read timeout");
    let mut request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    request.push_str(body);
    stream.write_all(request.as_bytes()).expect("send");
    let mut response = Vec::new();
    stream.read_to_end(&mut response).expect("read");
    let response = String::from_utf8_lossy(&response).into_owned();
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("a status line");
    let chunked = head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked");
    (
        status,
        if chunked {
            dechunk(body)
        } else {
            body.to_owned()
        },
    )
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(size) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if size == 0 || rest.len() < size {
            break;
        }
        out.push_str(&rest[..size]);
        body = rest[size..].trim_start_matches("\r\n");
    }
    out
}
