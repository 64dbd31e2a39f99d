//! The whole pipeline (examples/pipeline/README.md, and its table of what each failure costs) as
//! separate processes — api, worker, relay, model, mailer — on a `redis-server` of its own and a
//! PostgreSQL database of its own, driven as its README describes the roles and the model's
//! scripted answers. Each crash test kills a real process (SIGKILL) in the window that matters and
//! asserts effect counts: model calls, summary rows, outbox rows, emails, deliveries; the API
//! refuses hostile input and keeps tenants apart. Every wait is a bounded poll; nothing asserts on
//! timing.
#![cfg(all(feature = "worker", feature = "outbox"))]

mod support;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use support::http;
use support::pipeline::{eventually, settle, within, Pipeline, DEAD, LIMIT, STREAM};
use tower_once_test_support::ports::free_port;
use tower_once_test_support::postgres::Database;
use tower_once_test_support::redis::RedisServer;

#[test]
fn a_summary_request_runs_once_and_sends_one_email() {
    let mut p = Pipeline::new();
    p.start_all("5000");
    let (status, job_id) = p.submit("acme", "k1", "hello pipeline");
    assert_eq!(status, 202);
    assert!(!job_id.is_empty());
    // The client's retry: the same job, replayed, not enqueued again.
    assert_eq!(
        p.submit("acme", "k1", "hello pipeline"),
        (202, job_id.clone())
    );
    // Another tenant with the same key is another job.
    let (_, other) = p.submit("globex", "k1", "hello pipeline");
    assert_ne!(other, job_id);
    let (status, _) = http(
        "GET",
        &format!("http://127.0.0.1:{}/v1/summaries/nope", p.api),
        &[],
        "",
    );
    assert_eq!(status, 404);
    eventually("both emails", || p.emails().len() == 2);
    let (status, body) = http(
        "GET",
        &format!("http://127.0.0.1:{}/v1/summaries/{job_id}", p.api),
        &[],
        "",
    );
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("hello pipeline"), "{body}");
    settle();
    assert_eq!(p.model_calls("hello pipeline"), 2);
    assert_eq!((p.summaries(&job_id), p.outbox_rows(&job_id)), (1, 1));
    assert_eq!(p.deliveries(), 2);
    let keys: Vec<_> = p
        .emails()
        .iter()
        .map(|e| e["key"].as_str().unwrap_or("").to_owned())
        .collect();
    assert!(keys.contains(&format!("{job_id}:email")), "{keys:?}");
}

#[test]
fn a_worker_that_commits_and_dies_before_xack_has_its_effects_once() {
    let mut p = Pipeline::new();
    p.start("model", "model", &[]);
    p.start("mailer", "mailer", &[]);
    p.start("api", "api", &[]);
    p.start("relay", "relay", &["--claim-idle-ms", "1000"]);
    // Commits, then lingers 30 s before returning (and so before XACK): killed in there.
    p.start(
        "w1",
        "worker",
        &["--claim-idle-ms", "1000", "--linger-ms", "30000"],
    );
    let (_, job_id) = p.submit("acme", "k", "crash after commit");
    eventually("the commit", || p.summaries(&job_id) == 1);
    p.proc("w1").kill();
    assert_eq!(p.pending(), 1, "not acknowledged");
    p.start("w2", "worker", &["--claim-idle-ms", "1000"]);
    eventually("the takeover", || p.pending() == 0);
    eventually("the email", || p.emails().len() == 1);
    settle();
    assert_eq!(p.proc("w2").outcomes(), ["duplicate"]);
    assert_eq!(p.model_calls("crash after commit"), 1);
    assert_eq!((p.summaries(&job_id), p.outbox_rows(&job_id)), (1, 1));
    assert_eq!(p.emails().len(), 1);
}

#[test]
fn the_same_job_enqueued_twice_has_one_summary_and_one_email() {
    let mut p = Pipeline::new();
    p.start_all("5000");
    let (_, job_id) = p.submit("acme", "k", "enqueued twice");
    // The API died after XADD and the retry enqueued again: the same job id, twice.
    let payload = r#"{"tenant":"acme","text":"enqueued twice","notify":"a@example.com"}"#;
    p.redis
        .cli(&["XADD", STREAM, "*", "job_id", &job_id, "payload", payload]);
    eventually("both deliveries acknowledged and the email", || {
        p.pending() == 0 && p.emails().len() == 1
    });
    settle();
    assert_eq!((p.summaries(&job_id), p.outbox_rows(&job_id)), (1, 1));
    assert_eq!(p.emails().len(), 1);
    assert_eq!(p.deliveries(), 1);
}

#[test]
fn a_frozen_worker_and_its_reclaimer_commit_one_summary_and_one_email() {
    let mut p = Pipeline::new();
    p.start("model", "model", &[]);
    p.start("mailer", "mailer", &[]);
    p.start("api", "api", &[]);
    p.start("relay", "relay", &["--claim-idle-ms", "1000"]);
    p.start("slow", "worker", &["--claim-idle-ms", "1000"]);
    let text = "slow one [slow:2500]";
    let (_, job_id) = p.submit("acme", "k", text);
    eventually("the first model call", || p.model_calls(text) == 1);
    // Frozen (a long GC pause, a stalled VM): it cannot refresh its claims, so the entry is
    // taken over; then it resumes, and its run-once claim, completed first in its
    // transaction, is found lost: it rolls back and leaves the entry to the reclaimer.
    p.proc("slow").signal("STOP");
    std::thread::sleep(Duration::from_millis(1500));
    p.start("reclaimer", "worker", &["--claim-idle-ms", "1000"]);
    eventually("the second model call", || p.model_calls(text) == 2);
    p.proc("slow").signal("CONT");
    eventually("both outcomes", || {
        p.proc("slow").outcomes().len() + p.proc("reclaimer").outcomes().len() == 2
    });
    eventually("the email", || p.emails().len() == 1);
    settle();
    let mut outcomes = p.proc("slow").outcomes();
    outcomes.extend(p.proc("reclaimer").outcomes());
    outcomes.sort();
    assert_eq!(outcomes, ["done", "lost"]);
    assert_eq!(p.model_calls(text), 2);
    assert_eq!((p.summaries(&job_id), p.outbox_rows(&job_id)), (1, 1));
    assert_eq!(p.emails().len(), 1);
}

#[test]
fn a_model_that_keeps_answering_429_is_tried_4_times_and_left_pending() {
    let mut p = Pipeline::new();
    p.start_all("30000");
    let text = "busy [429]";
    let (_, job_id) = p.submit("acme", "k", text);
    eventually("4 attempts", || p.model_calls(text) >= 4);
    settle();
    assert_eq!(p.model_calls(text), 4);
    assert_eq!(p.pending(), 1, "left pending for redelivery");
    assert_eq!(p.dead_letters(), 0);
    assert_eq!(p.summaries(&job_id), 0);
}

#[test]
fn a_model_that_answers_400_is_dead_lettered_after_one_call() {
    let mut p = Pipeline::new();
    p.start_all("30000");
    let text = "bad [400]";
    let (_, job_id) = p.submit("acme", "k", text);
    eventually("the dead letter", || p.dead_letters() == 1);
    settle();
    assert_eq!(p.model_calls(text), 1);
    assert_eq!(p.pending(), 0);
    assert_eq!(p.summaries(&job_id), 0);
    let dead = p.redis.cli(&["XRANGE", DEAD, "-", "+"]);
    assert!(
        dead.contains(&job_id) && dead.contains("permanent"),
        "{dead}"
    );
}

#[test]
fn a_model_that_hangs_is_cut_per_attempt_and_the_delivery_by_its_deadline() {
    let mut p = Pipeline::new();
    p.start("model", "model", &[]);
    p.start("mailer", "mailer", &[]);
    p.start("api", "api", &[]);
    p.start(
        "worker",
        "worker",
        &[
            "--claim-idle-ms",
            "30000",
            "--model-timeout-ms",
            "300",
            "--job-deadline-ms",
            "1500",
        ],
    );
    let text = "stuck [hang]";
    let (_, job_id) = p.submit("acme", "k", text);
    eventually("a retried attempt", || p.model_calls(text) >= 2);
    settle();
    let calls = p.model_calls(text);
    // Each attempt cut at 300 ms, retried with backoff, until the 1.5 s deadline ends it:
    // more than one attempt, fewer than the 4 allowed would need without the deadline... or
    // all 4 if they fit; never more, and no redelivery within claim_idle.
    assert!((2..=4).contains(&calls), "{calls}");
    settle();
    assert_eq!(
        p.model_calls(text),
        calls,
        "the delivery ended at its deadline"
    );
    assert_eq!(
        (p.pending(), p.dead_letters(), p.summaries(&job_id)),
        (1, 0, 0)
    );
}

#[test]
fn a_mail_provider_that_is_down_gets_the_email_when_it_is_back() {
    let mut p = Pipeline::new();
    p.start("model", "model", &[]);
    p.start("api", "api", &[]);
    p.start("worker", "worker", &[]);
    p.start("relay", "relay", &[]);
    let (_, job_id) = p.submit("acme", "k", "mailer down");
    eventually("a failed send", || {
        p.db.count(&format!(
            "SELECT count(*) FROM outbox WHERE dedupe_key = '{job_id}:email' AND attempts >= 1 AND last_error IS NOT NULL AND sent_at IS NULL"
        )) == 1
    });
    p.start("mailer", "mailer", &[]);
    eventually("the email", || p.emails().len() == 1);
    settle();
    assert_eq!(p.emails().len(), 1);
    assert_eq!(p.outbox_rows(&job_id), 1);
    assert_eq!(
        p.db.count("SELECT count(*) FROM outbox WHERE sent_at IS NOT NULL"),
        1
    );
}

#[test]
fn a_relay_killed_after_sending_resends_with_the_same_key_and_the_mailer_keeps_one_email() {
    let mut p = Pipeline::new();
    p.start("model", "model", &[]);
    p.start("mailer", "mailer", &[]);
    p.start("api", "api", &[]);
    p.start("worker", "worker", &[]);
    // Lease 4 s; after the mailer answers it lingers 3 s before recording the send: killed there.
    p.start(
        "r1",
        "relay",
        &["--claim-idle-ms", "4000", "--linger-ms", "3000"],
    );
    let (_, job_id) = p.submit("acme", "k", "relay crash");
    eventually("the first delivery", || p.deliveries() == 1);
    p.proc("r1").kill();
    assert_eq!(
        p.db.count("SELECT count(*) FROM outbox WHERE sent_at IS NULL"),
        1,
        "sent but not recorded"
    );
    p.start("r2", "relay", &["--claim-idle-ms", "4000"]);
    eventually("the resend, after the lease", || {
        p.db.count("SELECT count(*) FROM outbox WHERE sent_at IS NOT NULL") == 1
    });
    settle();
    assert_eq!(p.deliveries(), 2, "the documented window: sent twice");
    let emails = p.emails();
    assert_eq!(emails.len(), 1, "the mailer's dedupe keeps it to one email");
    assert_eq!(emails[0]["key"], format!("{job_id}:email"));
}

#[test]
fn two_relays_draining_one_outbox_send_every_row_once() {
    let mut p = Pipeline::new();
    p.start("model", "model", &[]);
    p.start("api", "api", &[]);
    p.start("worker", "worker", &[]);
    let jobs: Vec<String> = (0..20)
        .map(|i| {
            p.submit("acme", &format!("k{i}"), &format!("job number {i}"))
                .1
        })
        .collect();
    // The worker creates the outbox table as it starts, and it has no port to wait for.
    eventually("the worker's outbox table", || {
        p.db.count("SELECT count(*) FROM pg_tables WHERE tablename = 'outbox'") == 1
    });
    eventually("every summary", || {
        p.db.count("SELECT count(*) FROM outbox") == 20
    });
    // The rows wait; then two relays start at once on the same outbox.
    p.start("mailer", "mailer", &[]);
    p.start("r1", "relay", &[]);
    p.start("r2", "relay", &[]);
    eventually("every email", || p.emails().len() == 20);
    settle();
    assert_eq!(p.deliveries(), 20, "no row sent twice");
    for job in &jobs {
        assert_eq!(p.outbox_rows(job), 1);
    }
}

#[test]
fn the_all_role_runs_the_pipeline_in_one_process_and_stops_on_sigterm() {
    let redis = RedisServer::start();
    let db = Database::create();
    let binary = support::example_binary_with("pipeline", "worker outbox postgres");
    // The process binds three ports from `base` and prints a line once all three accept
    // connections; only the first was found free, so a test running beside this one may hold
    // the others: then it exits at once, and it is started again on other ports.
    let log = std::env::temp_dir().join(format!("pipeline-all-{}.log", std::process::id()));
    let (mut child, base) = (0..5)
        .find_map(|_| {
            let base = free_port();
            let mut child = Command::new(&binary)
                .args(["all", "--redis", &redis.url(), "--postgres", &db.url()])
                .args(["--addr", &format!("127.0.0.1:{base}")])
                .env("RUST_LOG", "warn")
                .stdout(Stdio::piped())
                .stderr(std::fs::File::create(&log).expect("log file"))
                .spawn()
                .expect("start");
            let stdout = child.stdout.take().expect("piped stdout");
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                use std::io::BufRead;
                let first = std::io::BufReader::new(stdout).lines().next();
                let _ = tx.send(matches!(first, Some(Ok(line)) if line.starts_with("listening")));
            });
            match rx.recv_timeout(LIMIT) {
                Ok(true) => Some((child, base)),
                Ok(false) => {
                    let _ = child.wait();
                    None
                }
                Err(_) => panic!("nothing listens on {base}..+2 after {LIMIT:?}"),
            }
        })
        .expect("five tries found no three free ports");
    let log_on_failure = |what: &str| {
        let log = std::fs::read_to_string(&log).unwrap_or_default();
        format!("{what}; the process's log:\n{log}")
    };
    let body = r#"{"text":"all in one","notify":"a@example.com"}"#;
    let (status, _) = http(
        "POST",
        &format!("http://127.0.0.1:{base}/v1/summaries"),
        &[
            ("Idempotency-Key", "k"),
            ("X-Tenant-Id", "t"),
            ("Content-Type", "application/json"),
        ],
        body,
    );
    assert_eq!(status, 202);
    let mailer = format!("http://127.0.0.1:{}/emails", base + 2);
    let started = Instant::now();
    while !http("GET", &mailer, &[], "").1.contains("a@example.com") {
        assert!(started.elapsed() < LIMIT, "{}", log_on_failure("no email"));
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        assert!(started.elapsed() < LIMIT, "no exit after SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        status.success(),
        "{}",
        log_on_failure(&format!("{status:?}"))
    );
    let _ = std::fs::remove_file(&log);
}

/// A text or address holding a NUL character (valid JSON, `"\u0000"`, which Postgres `TEXT`
/// refuses) is refused by the API or summarized once: never a job redelivered until it is
/// dead-lettered. Was broken: the API accepted it (`202`), the worker's `INSERT INTO summaries`
/// failed, was classified transient, and the job was redelivered, one model call per delivery,
/// never a summary or an email, until `max_deliveries` dead-lettered it.
#[test]
fn a_request_with_a_nul_character_is_refused_or_summarized_once() {
    let mut p = Pipeline::new();
    p.start_all("1000");
    let (status, _) = p.submit("acme", "k", "nul \u{0} inside");
    if status == 202 {
        within(LIMIT, || {
            p.summary_count() == 1 || p.total_model_calls() >= 2
        });
        assert_eq!(
            (p.summary_count(), p.total_model_calls()),
            (1, 1),
            "accepted with 202, then: summaries, model calls"
        );
    } else {
        assert_eq!(status, 400, "refused up front");
    }
}

/// A job id the worker accepts (1 to 255 visible ASCII characters) is summarized and mailed once,
/// however long. Was broken: the outbox key is `<job_id>:email` and the outbox takes at most 255
/// bytes, so for a job id over 249 bytes `enqueue` refused the key (`is_invalid`), the handler
/// mapped that to a transient error, the transaction (summary included) rolled back, and every
/// redelivery called the model again.
#[test]
fn a_job_with_a_long_valid_job_id_is_summarized_and_mailed_once() {
    let mut p = Pipeline::new();
    p.start("model", "model", &[]);
    p.start("mailer", "mailer", &[]);
    p.start("worker", "worker", &["--claim-idle-ms", "1000"]);
    p.start("relay", "relay", &["--claim-idle-ms", "1000"]);
    let job_id = format!("order-{}", "9".repeat(244));
    assert_eq!(job_id.len(), 250);
    let payload = r#"{"tenant":"acme","text":"a long order id","notify":"a@example.com"}"#;
    p.redis
        .cli(&["XADD", STREAM, "*", "job_id", &job_id, "payload", payload]);
    within(LIMIT, || {
        p.emails().len() == 1 || p.total_model_calls() >= 2
    });
    assert_eq!(
        (p.summary_count(), p.total_model_calls(), p.emails().len()),
        (1, 1, 1),
        "summaries, model calls, emails"
    );
}

/// A tenant cannot read another tenant's summary (examples/pipeline/README.md: `GET
/// /v1/summaries/{job_id}` with an `X-Tenant-Id` answers only that tenant's jobs; without the
/// header the job id, given only to the tenant that submitted it, is the capability). Was broken:
/// `POST` was scoped by `X-Tenant-Id` and the `GET` was not, so another tenant read a summary by
/// its job id.
#[test]
fn a_tenant_cannot_read_another_tenants_summary() {
    let mut p = Pipeline::new();
    p.start_all("1000");
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

/// A job id holding a NUL character (`%00` in the path) is the client's bad input: a `404`, not an
/// outage. Was broken: it was sent to Postgres, which refuses it in `TEXT`, and the API answered
/// `503 the database is unavailable` (retry later; alerts fire).
#[test]
fn a_get_with_a_nul_in_the_job_id_is_a_404_not_an_outage() {
    let mut p = Pipeline::new();
    p.start("api", "api", &[]);
    let (status, body) = p.get("/v1/summaries/job%00id", &[]);
    assert!(status == 404 || status == 400, "{status} {body}");
}

/// Held up: hostile requests get a 4xx and enqueue nothing; SQL metacharacters in a job id are
/// a 404, not an error or an injection.
#[test]
fn hostile_api_requests_are_refused_and_enqueue_nothing() {
    let mut p = Pipeline::new();
    p.start("api", "api", &[]);
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
    assert_eq!(p.summary_count(), 0, "the table is still there");
}
