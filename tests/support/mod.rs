//! Real processes for the tests: `redis-server` instances, a local Redis Cluster and the demo
//! server binary. Everything listens on loopback, on free ports, and is killed when dropped.
#![allow(dead_code)] // each test binary uses part of this module

pub(crate) mod pipeline;
#[cfg(feature = "worker")]
pub(crate) mod worker;

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A port nobody listens on (and whose cluster bus port, +10000, is in range).
pub(crate) fn free_port() -> u16 {
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("bind an ephemeral loopback port")
            .port();
        if port < 55_000 {
            return port;
        }
    }
}

/// Waits (bounded) until something accepts connections on `port`.
pub(crate) fn wait_for_port(port: u16, limit: Duration) {
    let started = Instant::now();
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    while TcpStream::connect_timeout(&addr, Duration::from_millis(100)).is_err() {
        assert!(
            started.elapsed() < limit,
            "nothing listens on {port} after {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A `redis-server` of our own: no persistence, loopback only.
pub(crate) struct RedisServer {
    pub(crate) port: u16,
    child: Option<Child>,
    dir: PathBuf,
    extra: Vec<String>,
}

impl RedisServer {
    pub(crate) fn start() -> Self {
        Self::start_with(free_port(), &[])
    }

    pub(crate) fn start_with(port: u16, extra: &[&str]) -> Self {
        let dir =
            std::env::temp_dir().join(format!("tower-once-redis-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create the redis data dir");
        let mut server = Self {
            port,
            child: None,
            dir,
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        server.restart();
        server
    }

    /// Starts the server again on the same port (after `stop`).
    pub(crate) fn restart(&mut self) {
        assert!(self.child.is_none(), "already running");
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server is on PATH (.ci/run installs it)");
        self.child = Some(child);
        wait_for_port(self.port, Duration::from_secs(10));
    }

    /// Stops the server (SIGKILL), as a crash or a network cut would.
    pub(crate) fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Freezes (SIGSTOP) or thaws (SIGCONT) the server: a Redis that accepts connections but
    /// answers nothing, like one stuck in a long command or behind a stalled network.
    pub(crate) fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().expect("running").id().to_string();
        let status = Command::new("kill")
            .args([signal, &pid])
            .status()
            .expect("kill");
        assert!(status.success());
    }

    /// Runs `redis-cli` against this server and returns its standard output.
    pub(crate) fn cli(&self, args: &[&str]) -> String {
        redis_cli(self.port, args)
    }

    /// `INFO commandstats` as (command, calls) pairs.
    pub(crate) fn command_calls(&self) -> Vec<(String, u64)> {
        self.cli(&["INFO", "commandstats"])
            .lines()
            .filter_map(|line| {
                let rest = line.strip_prefix("cmdstat_")?;
                let (name, stats) = rest.split_once(':')?;
                let calls = stats.split(',').find_map(|kv| kv.strip_prefix("calls="))?;
                Some((name.to_owned(), calls.trim().parse().ok()?))
            })
            .collect()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub(crate) fn redis_cli(port: u16, args: &[&str]) -> String {
    let Output { stdout, .. } = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .expect("redis-cli is on PATH");
    String::from_utf8_lossy(&stdout).into_owned()
}

/// A local three-master Redis Cluster.
pub(crate) struct RedisCluster {
    pub(crate) nodes: Vec<RedisServer>,
}

impl RedisCluster {
    pub(crate) fn start() -> Self {
        let nodes: Vec<_> = (0..3)
            .map(|_| {
                let port = free_port();
                let conf = format!("nodes-{port}.conf");
                RedisServer::start_with(
                    port,
                    &[
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        &conf,
                        "--cluster-node-timeout",
                        "5000",
                    ],
                )
            })
            .collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let status = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("redis-cli --cluster create");
        assert!(status.success(), "cluster creation failed");
        let started = Instant::now();
        for node in &nodes {
            while !node.cli(&["CLUSTER", "INFO"]).contains("cluster_state:ok") {
                assert!(
                    started.elapsed() < Duration::from_secs(30),
                    "cluster never became ok"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Self { nodes }
    }

    pub(crate) fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }
}

/// An example binary (`examples/<name>`), which `cargo test` builds beside the tests.
pub(crate) fn example_binary(name: &str) -> PathBuf {
    example_binary_with(name, "redis retry")
}

/// [`example_binary`] for an example that needs other features to build.
pub(crate) fn example_binary_with(name: &str, features: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps/<test>");
    let binary = profile_dir.join("examples").join(name);
    if !binary.exists() {
        // `cargo test --test <name>` builds only that target: build the example too.
        let status = Command::new(env!("CARGO"))
            .args(["build", "--example", name, "--features", features])
            .status()
            .expect("run cargo build");
        assert!(status.success(), "building the {name} example failed");
    }
    binary
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

/// A PostgreSQL database of its own on the machine's server (`PG_URL`, default
/// `postgres://postgres@127.0.0.1:5432`), dropped (with `FORCE`) when this is.
pub(crate) struct PgDatabase {
    pub(crate) name: String,
    base: String,
}

impl PgDatabase {
    pub(crate) fn create() -> Self {
        let base = std::env::var("PG_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".to_owned());
        let name = format!("tower_once_{}_{}", std::process::id(), fastrand::u32(..));
        let db = Self { name, base };
        db.admin(&format!("CREATE DATABASE {}", db.name));
        db
    }

    pub(crate) fn url(&self) -> String {
        format!("{}/{}", self.base, self.name)
    }

    fn admin(&self, sql: &str) {
        let out = Command::new("psql")
            .arg(format!("{}/postgres", self.base))
            .args(["-q", "-v", "ON_ERROR_STOP=1", "-c", sql])
            .output()
            .expect("run psql");
        assert!(
            out.status.success(),
            "{sql}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// One value from `sql`, as text ("" for no row).
    pub(crate) fn query(&self, sql: &str) -> String {
        let out = Command::new("psql")
            .arg(self.url())
            .args(["-qtAX", "-v", "ON_ERROR_STOP=1", "-c", sql])
            .output()
            .expect("run psql");
        assert!(
            out.status.success(),
            "{sql}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    pub(crate) fn count(&self, sql: &str) -> u64 {
        self.query(sql).parse().unwrap_or(0)
    }
}

impl Drop for PgDatabase {
    fn drop(&mut self) {
        let _ = Command::new("psql")
            .arg(format!("{}/postgres", self.base))
            .args([
                "-q",
                "-c",
                &format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name),
            ])
            .output();
    }
}
