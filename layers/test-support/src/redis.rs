//! A `redis-server` of the test's own, and a local three-master Redis Cluster: loopback only,
//! free ports, no persistence, killed when dropped.

use crate::ports::{free_port, wait_for_port};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A `redis-server` of our own: no persistence, loopback only, killed (SIGKILL) on drop.
#[derive(Debug)]
pub struct RedisServer {
    /// The port it listens on (on `127.0.0.1`).
    pub port: u16,
    child: Option<Child>,
    dir: PathBuf,
    extra: Vec<String>,
}

impl RedisServer {
    /// Starts a server on a free port, and waits until it accepts connections.
    pub fn start() -> Self {
        Self::start_with(free_port(), &[])
    }

    /// Starts a server on `port` with `extra` arguments for `redis-server`, and waits until it
    /// accepts connections.
    pub fn start_with(port: u16, extra: &[&str]) -> Self {
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
    ///
    /// # Panics
    ///
    /// If it is running.
    pub fn restart(&mut self) {
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
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Its URL, `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Freezes (SIGSTOP) or thaws (SIGCONT) the server: a Redis that accepts connections but
    /// answers nothing, like one stuck in a long command or behind a stalled network.
    pub fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().expect("running").id().to_string();
        let status = Command::new("kill")
            .args([signal, &pid])
            .status()
            .expect("kill");
        assert!(status.success());
    }

    /// Runs `redis-cli` against this server and returns its standard output.
    pub fn cli(&self, args: &[&str]) -> String {
        redis_cli(self.port, args)
    }

    /// `INFO commandstats` as (command, calls) pairs.
    pub fn command_calls(&self) -> Vec<(String, u64)> {
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

/// Runs `redis-cli` against the server on `port` and returns its standard output.
pub fn redis_cli(port: u16, args: &[&str]) -> String {
    let Output { stdout, .. } = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .expect("redis-cli is on PATH");
    String::from_utf8_lossy(&stdout).into_owned()
}

/// A local three-master Redis Cluster, no replicas.
#[derive(Debug)]
pub struct RedisCluster {
    /// Its masters.
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts three servers in cluster mode, creates the cluster and waits (bounded) until
    /// every node says it is ok.
    pub fn start() -> Self {
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

    /// The URLs of its nodes.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }
}
