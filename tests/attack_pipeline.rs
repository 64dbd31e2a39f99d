//! Attacks on `examples/pipeline`, run as separate processes on a `redis-server` of their own
//! and a PostgreSQL database of their own, like `tests/pipeline.rs`. The tests that fail name
//! a broken promise; the others held up. Every wait is bounded.
#![cfg(all(feature = "worker", feature = "outbox"))]

mod support;

use support::pipeline::{within, Pipeline, LIMIT, STREAM};

/// Was a break, now fixed: the API accepts (`202`) a text or address holding a NUL character (valid JSON,
/// `"\u0000"`), but Postgres `TEXT` refuses it: the worker's `INSERT INTO summaries` fails,
/// is classified transient, and the job is redelivered — one model call per delivery, never a
/// summary or an email, until `max_deliveries` dead-letters it.
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

/// Was a break, now fixed: the worker accepts any job id of 1 to 255 visible ASCII characters, but the outbox
/// key is `<job_id>:email` and the outbox takes at most 255 bytes: for a job id over 249
/// bytes `enqueue` refuses the key (`is_invalid`), the handler maps that to a transient error,
/// the transaction (summary included) rolls back, and every redelivery calls the model again.
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

/// Was a break: `POST` is scoped by `X-Tenant-Id`, `GET /v1/summaries/{job_id}` was not, so
/// another tenant read a summary by its job id. A tenant that names itself now reads only its
/// own; without the header the job id (given only to the tenant that submitted it, derived
/// from a SHA-256 of its scoped key) is the capability, as the issue's contract has it.
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

/// Was a break, now fixed: a job id holding a NUL character (`%00` in the path) is sent to Postgres, which
/// refuses it in `TEXT`, and the API answers `503 the database is unavailable`: the client's
/// bad input is reported as an outage (retry later; alerts fire) instead of a `404`.
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
