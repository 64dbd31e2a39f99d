//! The pipeline example as separate processes (`examples/pipeline`), for the pipeline tests: a
//! `redis-server` and a PostgreSQL database of its own, each role on a free port, its stdout kept
//! for the worker's outcome lines, everything killed on drop.

use super::{example_binary_with, http};
use serde_json::Value;
use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tower_once_test_support::ports::{free_port, wait_for_port};
use tower_once_test_support::postgres::Database;
use tower_once_test_support::redis::RedisServer;

pub(crate) const LIMIT: Duration = Duration::from_secs(60);
pub(crate) const STREAM: &str = "jobs:summaries";
pub(crate) const DEAD: &str = "jobs:summaries:dead";

pub(crate) struct Proc {
    child: Option<Child>,
    stdout: PathBuf,
}

impl Proc {
    pub(crate) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub(crate) fn signal(&self, signal: &str) {
        if let Some(child) = &self.child {
            let _ = Command::new("kill")
                .args([&format!("-{signal}"), &child.id().to_string()])
                .status();
        }
    }

    /// The worker's outcome lines (`{"job_id", "outcome", "deliveries"}`).
    pub(crate) fn outcomes(&self) -> Vec<String> {
        std::fs::read_to_string(&self.stdout)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter_map(|v| v["outcome"].as_str().map(str::to_owned))
            .collect()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_file(&self.stdout);
    }
}

pub(crate) struct Pipeline {
    pub(crate) redis: RedisServer,
    pub(crate) db: Database,
    pub(crate) api: u16,
    pub(crate) model: u16,
    pub(crate) mailer: u16,
    procs: HashMap<String, Proc>,
}

impl Pipeline {
    pub(crate) fn new() -> Self {
        Self {
            redis: RedisServer::start(),
            db: Database::create(),
            api: free_port(),
            model: free_port(),
            mailer: free_port(),
            procs: HashMap::new(),
        }
    }

    /// Starts `role` under `name` with extra flags; HTTP roles are waited for. A port taken
    /// between `free_port` and the role's bind (another test's server, tests run in parallel)
    /// makes the role exit: it is started again on another port, and the roles started after
    /// it are given that one.
    pub(crate) fn start(&mut self, name: &str, role: &str, extra: &[&str]) {
        for _ in 0..5 {
            let (child, stdout) = self.spawn(name, role, extra);
            let mut child = child;
            let Some(port) = self.port_of(role) else {
                self.keep(name, child, stdout);
                return;
            };
            wait_for_port(port, LIMIT);
            // Ours, or another process's on the same port? Ours is still running a moment on.
            std::thread::sleep(Duration::from_millis(300));
            if child.try_wait().ok().flatten().is_none() {
                self.keep(name, child, stdout);
                return;
            }
            match role {
                "api" => self.api = free_port(),
                "model" => self.model = free_port(),
                _ => self.mailer = free_port(),
            }
        }
        panic!("{role} could not bind a free port in five tries");
    }

    fn port_of(&self, role: &str) -> Option<u16> {
        match role {
            "api" => Some(self.api),
            "model" => Some(self.model),
            "mailer" => Some(self.mailer),
            _ => None,
        }
    }

    fn keep(&mut self, name: &str, child: std::process::Child, stdout: std::path::PathBuf) {
        self.procs.insert(
            name.to_owned(),
            Proc {
                child: Some(child),
                stdout,
            },
        );
    }

    fn spawn(
        &self,
        name: &str,
        role: &str,
        extra: &[&str],
    ) -> (std::process::Child, std::path::PathBuf) {
        let binary = example_binary_with("pipeline", "worker outbox postgres");
        let stdout = std::env::temp_dir().join(format!(
            "tower-once-pipeline-{}-{}-{name}.out",
            std::process::id(),
            fastrand::u32(..)
        ));
        let mut cmd = Command::new(binary);
        cmd.arg(role)
            .args(["--redis", &self.redis.url(), "--postgres", &self.db.url()])
            .args(["--model", &format!("http://127.0.0.1:{}", self.model)])
            .args(["--mailer", &format!("http://127.0.0.1:{}", self.mailer)])
            .args(["--poll-ms", "200"]);
        if let Some(port) = self.port_of(role) {
            cmd.args(["--addr", &format!("127.0.0.1:{port}")]);
        }
        let child = cmd
            .args(extra)
            .env("RUST_LOG", "warn")
            .stdout(std::fs::File::create(&stdout).expect("stdout file"))
            .stderr(Stdio::null())
            .spawn()
            .expect("start the pipeline example");
        (child, stdout)
    }

    /// Every role, worker and relay with `claim_idle`/lease `claim_idle_ms`.
    pub(crate) fn start_all(&mut self, claim_idle_ms: &str) {
        self.start("model", "model", &[]);
        self.start("mailer", "mailer", &[]);
        self.start("api", "api", &[]);
        self.start("worker", "worker", &["--claim-idle-ms", claim_idle_ms]);
        self.start("relay", "relay", &["--claim-idle-ms", claim_idle_ms]);
    }

    pub(crate) fn proc(&mut self, name: &str) -> &mut Proc {
        self.procs.get_mut(name).expect("started")
    }

    /// `POST /v1/summaries`: status and job id.
    pub(crate) fn submit(&self, tenant: &str, key: &str, text: &str) -> (u16, String) {
        let body = serde_json::json!({ "text": text, "notify": "a@example.com" }).to_string();
        let (status, body) = http(
            "POST",
            &format!("http://127.0.0.1:{}/v1/summaries", self.api),
            &[
                ("Idempotency-Key", key),
                ("X-Tenant-Id", tenant),
                ("Content-Type", "application/json"),
            ],
            &body,
        );
        let job_id = serde_json::from_str::<Value>(&body)
            .ok()
            .and_then(|v| v["job_id"].as_str().map(str::to_owned))
            .unwrap_or_default();
        (status, job_id)
    }

    pub(crate) fn json(&self, port: u16, path: &str) -> Value {
        let (status, body) = http("GET", &format!("http://127.0.0.1:{port}{path}"), &[], "");
        assert_eq!(status, 200, "{path}: {body}");
        serde_json::from_str(&body).expect("json")
    }

    pub(crate) fn model_calls(&self, text: &str) -> u64 {
        let text: String = text
            .bytes()
            .map(|b| {
                if b.is_ascii_alphanumeric() {
                    (b as char).to_string()
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect();
        self.json(self.model, &format!("/calls?text={text}"))["calls"]
            .as_u64()
            .unwrap_or(0)
    }

    pub(crate) fn emails(&self) -> Vec<Value> {
        self.json(self.mailer, "/emails")
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    pub(crate) fn deliveries(&self) -> u64 {
        self.json(self.mailer, "/deliveries")["deliveries"]
            .as_u64()
            .unwrap_or(0)
    }

    pub(crate) fn summaries(&self, job_id: &str) -> u64 {
        self.db.count(&format!(
            "SELECT count(*) FROM summaries WHERE job_id = '{job_id}'"
        ))
    }

    pub(crate) fn outbox_rows(&self, job_id: &str) -> u64 {
        self.db.count(&format!(
            "SELECT count(*) FROM outbox WHERE dedupe_key = '{job_id}:email'"
        ))
    }

    pub(crate) fn pending(&self) -> u64 {
        let out = self.redis.cli(&["XPENDING", STREAM, "workers"]);
        out.lines()
            .next()
            .and_then(|l| l.trim().parse().ok())
            .unwrap_or(0)
    }

    pub(crate) fn dead_letters(&self) -> u64 {
        self.redis.cli(&["XLEN", DEAD]).trim().parse().unwrap_or(0)
    }
}

/// Polls `check` until it holds (bounded).
pub(crate) fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let started = Instant::now();
    while !check() {
        assert!(started.elapsed() < LIMIT, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub(crate) fn settle() {
    // Long enough for a wrong second effect to show up, if there were one.
    std::thread::sleep(Duration::from_millis(1500));
}

impl Pipeline {
    /// `POST /v1/summaries` with these headers and body, as sent.
    pub(crate) fn post(&self, headers: &[(&str, &str)], body: &str) -> (u16, String) {
        let url = format!("http://127.0.0.1:{}/v1/summaries", self.api);
        http("POST", &url, headers, body)
    }

    /// A `GET` on the API.
    pub(crate) fn get(&self, path: &str, headers: &[(&str, &str)]) -> (u16, String) {
        http(
            "GET",
            &format!("http://127.0.0.1:{}{path}", self.api),
            headers,
            "",
        )
    }

    /// Model calls over all texts.
    pub(crate) fn total_model_calls(&self) -> u64 {
        self.json(self.model, "/calls")["calls"]
            .as_u64()
            .unwrap_or(0)
    }

    /// Summary rows over all jobs.
    pub(crate) fn summary_count(&self) -> u64 {
        self.db.count("SELECT count(*) FROM summaries")
    }
}

/// Polls `check` until it holds or `limit` passes; whether it held.
pub(crate) fn within(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let started = Instant::now();
    while started.elapsed() < limit {
        if check() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    check()
}
