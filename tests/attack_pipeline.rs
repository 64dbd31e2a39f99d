//! Attacks on `examples/pipeline`, run as separate processes on a `redis-server` of their own
//! and a PostgreSQL database of their own, like `tests/pipeline.rs`. The tests that fail name
//! a broken promise; the others held up. Every wait is bounded.
#![cfg(all(feature = "worker", feature = "outbox"))]

mod support;

use serde_json::Value;
use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use support::{free_port, http, wait_for_port, PgDatabase, RedisServer};

const LIMIT: Duration = Duration::from_secs(30);
const STREAM: &str = "jobs:summaries";

struct Proc {
    child: Option<Child>,
    stdout: PathBuf,
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_file(&self.stdout);
    }
}

struct Pipeline {
    redis: RedisServer,
    db: PgDatabase,
    api: u16,
    model: u16,
    mailer: u16,
    procs: HashMap<String, Proc>,
}

impl Pipeline {
    fn new() -> Self {
        Self {
            redis: RedisServer::start(),
            db: PgDatabase::create(),
            api: free_port(),
            model: free_port(),
            mailer: free_port(),
            procs: HashMap::new(),
        }
    }

    fn start(&mut self, role: &str, extra: &[&str]) {
        let binary = support::example_binary_with("pipeline", "worker outbox");
        let stdout = std::env::temp_dir().join(format!(
            "tower-once-attack-pipeline-{}-{}-{role}.out",
            std::process::id(),
            fastrand::u32(..)
        ));
        let port = match role {
            "api" => Some(self.api),
            "model" => Some(self.model),
            "mailer" => Some(self.mailer),
            _ => None,
        };
        let mut cmd = Command::new(binary);
        cmd.arg(role)
            .args(["--redis", &self.redis.url(), "--postgres", &self.db.url()])
            .args(["--model", &format!("http://127.0.0.1:{}", self.model)])
            .args(["--mailer", &format!("http://127.0.0.1:{}", self.mailer)])
            .args(["--poll-ms", "200"]);
        if let Some(port) = port {
            cmd.args(["--addr", &format!("127.0.0.1:{port}")]);
        }
        let child = cmd
            .args(extra)
            .env("RUST_LOG", "warn")
            .stdout(std::fs::File::create(&stdout).expect("stdout file"))
            .stderr(Stdio::null())
            .spawn()
            .expect("start the pipeline example");
        if let Some(port) = port {
            wait_for_port(port, LIMIT);
        }
        self.procs.insert(
            role.to_owned(),
            Proc {
                child: Some(child),
                stdout,
            },
        );
    }

    /// Every role, worker and relay with `claim_idle`/lease 1 s: redeliveries come quickly.
    fn start_all(&mut self) {
        self.start("model", &[]);
        self.start("mailer", &[]);
        self.start("api", &[]);
        self.start("worker", &["--claim-idle-ms", "1000"]);
        self.start("relay", &["--claim-idle-ms", "1000"]);
    }

    fn post(&self, headers: &[(&str, &str)], body: &str) -> (u16, String) {
        http(
            "POST",
            &format!("http://127.0.0.1:{}/v1/summaries", self.api),
            headers,
            body,
        )
    }

    fn submit(&self, tenant: &str, key: &str, text: &str) -> (u16, String) {
        let body = serde_json::json!({ "text": text, "notify": "a@example.com" }).to_string();
        let (status, body) = self.post(
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

    fn get(&self, path: &str, headers: &[(&str, &str)]) -> (u16, String) {
        http(
            "GET",
            &format!("http://127.0.0.1:{}{path}", self.api),
            headers,
            "",
        )
    }

    fn model_calls(&self) -> u64 {
        let (_, body) = http(
            "GET",
            &format!("http://127.0.0.1:{}/calls", self.model),
            &[],
            "",
        );
        serde_json::from_str::<Value>(&body).expect("json")["calls"]
            .as_u64()
            .unwrap_or(0)
    }

    fn emails(&self) -> usize {
        let (_, body) = http(
            "GET",
            &format!("http://127.0.0.1:{}/emails", self.mailer),
            &[],
            "",
        );
        serde_json::from_str::<Value>(&body)
            .ok()
            .and_then(|v| v.as_array().map(Vec::len))
            .unwrap_or(0)
    }

    fn summaries(&self) -> u64 {
        self.db.count("SELECT count(*) FROM summaries")
    }
}

/// Polls `check` until it holds or `limit` passes; whether it held.
fn within(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let started = Instant::now();
    while started.elapsed() < limit {
        if check() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    check()
}

/// Was a break, now fixed: the API accepts (`202`) a text or address holding a NUL character (valid JSON,
/// `"\u0000"`), but Postgres `TEXT` refuses it: the worker's `INSERT INTO summaries` fails,
/// is classified transient, and the job is redelivered — one model call per delivery, never a
/// summary or an email, until `max_deliveries` dead-letters it.
#[test]
fn a_request_with_a_nul_character_is_refused_or_summarized_once() {
    let mut p = Pipeline::new();
    p.start_all();
    let (status, _) = p.submit("acme", "k", "nul \u{0} inside");
    if status == 202 {
        within(LIMIT, || p.summaries() == 1 || p.model_calls() >= 2);
        assert_eq!(
            (p.summaries(), p.model_calls()),
            (1, 1),
            "accepted with 202, then: summaries, model calls"
        );
    } else {
        assert_eq!(status, 400, "refused up front");
    }
}

/// Was a break, now fixed: the worker accepts any job id of 1 to 255 visible ASCII characters, but the outbox
/// key is `<job_id>:email` and the outbox takes at most 255 bytes: for a job id over 249
/// bytes `enqueue` refuses the key (`is_invalid`), the handler maps that to a transient error,
/// the transaction (summary included) rolls back, and every redelivery calls the model again.
#[test]
fn a_job_with_a_long_valid_job_id_is_summarized_and_mailed_once() {
    let mut p = Pipeline::new();
    p.start("model", &[]);
    p.start("mailer", &[]);
    p.start("worker", &["--claim-idle-ms", "1000"]);
    p.start("relay", &["--claim-idle-ms", "1000"]);
    let job_id = format!("order-{}", "9".repeat(244));
    assert_eq!(job_id.len(), 250);
    let payload = r#"{"tenant":"acme","text":"a long order id","notify":"a@example.com"}"#;
    p.redis
        .cli(&["XADD", STREAM, "*", "job_id", &job_id, "payload", payload]);
    within(LIMIT, || p.emails() == 1 || p.model_calls() >= 2);
    assert_eq!(
        (p.summaries(), p.model_calls(), p.emails()),
        (1, 1, 1),
        "summaries, model calls, emails"
    );
}

/// Was a break: `POST` is scoped by `X-Tenant-Id`, `GET /v1/summaries/{job_id}` was not, so
/// another tenant read a summary by its job id. A tenant that names itself now reads only its
/// own; without the header the job id (given only to the tenant that submitted it, derived
/// from a SHA-256 of its scoped key) is the capability, as the issue's contract has it.
#[test]
fn a_tenant_cannot_read_another_tenants_summary() {
    let mut p = Pipeline::new();
    p.start_all();
    let (status, job_id) = p.submit("acme", "k", "acme's confidential text");
    assert_eq!(status, 202);
    let path = format!("/v1/summaries/{job_id}");
    assert!(
        within(LIMIT, || p.get(&path, &[("X-Tenant-Id", "acme")]).0 == 200),
        "acme's summary"
    );
    let (status, body) = p.get(&path, &[("X-Tenant-Id", "globex")]);
    assert_ne!(status, 200, "globex read acme's summary: {body}");
    let (status, body) = p.get(&path, &[]);
    assert_eq!(status, 200, "the contract's GET, by job id alone: {body}");
}

/// Was a break, now fixed: a job id holding a NUL character (`%00` in the path) is sent to Postgres, which
/// refuses it in `TEXT`, and the API answers `503 the database is unavailable`: the client's
/// bad input is reported as an outage (retry later; alerts fire) instead of a `404`.
#[test]
fn a_get_with_a_nul_in_the_job_id_is_a_404_not_an_outage() {
    let mut p = Pipeline::new();
    p.start("api", &[]);
    let (status, body) = p.get("/v1/summaries/job%00id", &[]);
    assert!(status == 404 || status == 400, "{status} {body}");
}

/// Held up: hostile requests get a 4xx and enqueue nothing; SQL metacharacters in a job id are
/// a 404, not an error or an injection.
#[test]
fn hostile_api_requests_are_refused_and_enqueue_nothing() {
    let mut p = Pipeline::new();
    p.start("api", &[]);
    let json = ("Content-Type", "application/json");
    let good = r#"{"text":"t","notify":"a@example.com"}"#;
    // No Idempotency-Key.
    assert_eq!(p.post(&[("X-Tenant-Id", "t"), json], good).0, 400);
    // Malformed JSON, wrong shapes, empty text, not an address.
    for (i, bad) in [
        "{",
        "[]",
        r#"{"text":1,"notify":"a@b"}"#,
        r#"{"text":"","notify":"a@b"}"#,
        r#"{"text":"t","notify":"nobody"}"#,
    ]
    .iter()
    .enumerate()
    {
        let key = format!("bad-{i}");
        let (status, body) = p.post(
            &[("Idempotency-Key", &key), ("X-Tenant-Id", "t"), json],
            bad,
        );
        assert!((400..500).contains(&status), "{bad}: {status} {body}");
    }
    // Over the handler's 64 KiB.
    let big = format!(
        r#"{{"text":"{}","notify":"a@example.com"}}"#,
        "x".repeat(100 * 1024)
    );
    let (status, _) = p.post(
        &[("Idempotency-Key", "big"), ("X-Tenant-Id", "t"), json],
        &big,
    );
    assert_eq!(status, 413);
    let len = p.redis.cli(&["XLEN", STREAM]);
    assert_eq!(len.trim(), "0", "nothing enqueued");
    for id in ["x'%20OR%20'1'='1", "1;DROP%20TABLE%20summaries", "%27%3B--"] {
        let (status, body) = p.get(&format!("/v1/summaries/{id}"), &[]);
        assert!(status == 404 || status == 400, "{id}: {status} {body}");
    }
    assert_eq!(p.summaries(), 0, "the table is still there");
}
