//! Writing a message (crate docs "Semantics", the row "`Outbox::enqueue` in the caller's
//! transaction"; examples/pipeline/README.md): a message commits with its transaction and is sent
//! once, the same dedupe key is written once and a reused one refused, concurrent enqueues of one
//! key follow the first transaction, the table name is checked (another schema, a reserved word,
//! concurrent migrations), and hostile keys, topics, payloads and delays are stored verbatim. Against the machine's PostgreSQL (`DATABASE_URL`,
//! default `postgres://postgres@127.0.0.1:5432/test`): every test works in its own schema, dropped
//! at the end, so runs never see each other.

mod support;

use bytes::Bytes;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::{quick, Schema, Sent};
use tower::service_fn;
use tower_once_outbox::{Enqueued, Outbox, OutboxMessage, OutboxRelay};
use tower_once_retry::classify::Action;

#[tokio::test]
async fn a_message_commits_with_the_transaction_and_is_sent_once() {
    let db = Schema::new().await;
    let outbox = db.outbox().await;

    // Rolled back: never sent.
    let mut tx = db.pool.begin().await.unwrap();
    outbox
        .enqueue(&mut tx, "email", "rolled-back", "{}")
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    assert!(matches!(
        db.enqueue(&outbox, "k1", "{\"a\":1}").await,
        Enqueued::New(_)
    ));

    let sent = Sent::default();
    let s = sent.clone();
    let relay = OutboxRelay::new(
        outbox.clone(),
        quick(),
        service_fn(move |m: OutboxMessage| {
            s.note(&m);
            let request = m.http_request("http://mailer.test/send").unwrap();
            assert_eq!(request.headers()["idempotency-key"], "k1");
            assert_eq!(request.body(), &Bytes::from_static(b"{\"a\":1}"));
            async { Ok::<_, std::io::Error>(()) }
        }),
    )
    .unwrap();
    let report = relay.pass().await.unwrap();
    assert_eq!((report.claimed, report.sent), (1, 1));
    assert_eq!(relay.pass().await.unwrap().claimed, 0);
    assert_eq!((sent.of("k1"), sent.of("rolled-back")), (1, 0));
    assert_eq!(
        db.scalar("SELECT count(*) FROM outbox WHERE sent_at IS NOT NULL")
            .await,
        1
    );
    let stats = outbox.stats().await.unwrap();
    assert_eq!((stats.pending, stats.sent, stats.parked), (0, 1, 0));
}

#[tokio::test]
async fn the_same_key_is_written_once_and_a_reused_key_is_refused() {
    let db = Schema::new().await;
    let outbox = db.outbox().await;
    let first = db.enqueue(&outbox, "job-7:mail", "{}").await;
    let again = db.enqueue(&outbox, "job-7:mail", "{}").await;
    assert_eq!(again, Enqueued::Duplicate(first.id()));

    let mut tx = db.pool.begin().await.unwrap();
    let reused = outbox
        .enqueue(&mut tx, "email", "job-7:mail", "{\"other\":1}")
        .await;
    assert!(reused.unwrap_err().is_key_reused());
    let other_topic = outbox.enqueue(&mut tx, "sms", "job-7:mail", "{}").await;
    assert!(other_topic.unwrap_err().is_key_reused());
    for bad in ["", "with space", "crlf\r\n", "ü"] {
        let err = outbox
            .enqueue(&mut tx, "email", bad, "{}")
            .await
            .unwrap_err();
        assert!(err.is_invalid(), "{bad:?}");
    }
    let huge = vec![0u8; tower_once_outbox::DEFAULT_MAX_PAYLOAD + 1];
    assert!(outbox
        .enqueue(&mut tx, "email", "big", huge)
        .await
        .unwrap_err()
        .is_invalid());
    // The transaction is still usable after every refusal.
    outbox
        .enqueue(&mut tx, "email", "after-errors", "{}")
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(db.scalar("SELECT count(*) FROM outbox").await, 2);
}

#[tokio::test]
async fn concurrent_enqueues_of_one_key_wait_and_follow_the_first_transaction() {
    let db = Schema::new().await;
    let outbox = db.outbox().await;
    for commit_first in [false, true] {
        let key = format!("race-{commit_first}");
        let mut t1 = db.pool.begin().await.unwrap();
        let first = outbox.enqueue(&mut t1, "email", &key, "{}").await.unwrap();
        assert!(!first.is_duplicate());
        let (o, p, k) = (outbox.clone(), db.pool.clone(), key.clone());
        let second = tokio::spawn(async move {
            let mut t2 = p.begin().await.unwrap();
            let same = o.enqueue(&mut t2, "email", &k, "{}").await;
            // Another payload under the same key, in the same (still usable) transaction.
            let other = o.enqueue(&mut t2, "email", &k, "{\"x\":1}").await;
            o.enqueue(&mut t2, "email", &format!("{k}-after"), "{}")
                .await
                .unwrap();
            t2.commit().await.unwrap();
            (same.unwrap(), other)
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!second.is_finished(), "waits for the first transaction");
        if commit_first {
            t1.commit().await.unwrap();
        } else {
            t1.rollback().await.unwrap();
        }
        let (same, other) = second.await.unwrap();
        if commit_first {
            assert_eq!(same, Enqueued::Duplicate(first.id()));
        } else {
            assert!(matches!(same, Enqueued::New(_)));
        }
        assert!(other.unwrap_err().is_key_reused());
    }
    assert_eq!(db.scalar("SELECT count(*) FROM outbox").await, 4);
}

#[tokio::test]
async fn another_table_in_another_schema_and_concurrent_migrations() {
    let db = Schema::new().await;
    sqlx::query(&format!("CREATE SCHEMA {}_app", db.name))
        .execute(&db.pool)
        .await
        .unwrap();
    let table = format!("{}_app.mail_out", db.name);
    let outbox = Outbox::new(db.pool.clone()).table(&table).unwrap();
    let migrations: Vec<_> = (0..4)
        .map(|_| {
            let o = outbox.clone();
            tokio::spawn(async move { o.migrate().await })
        })
        .collect();
    for m in migrations {
        m.await.unwrap().unwrap();
    }
    db.enqueue(&outbox, "k", "{}").await;
    let relay = OutboxRelay::new(
        outbox.clone(),
        quick(),
        service_fn(|_m: OutboxMessage| async { Ok::<_, &'static str>(()) }),
    )
    .unwrap();
    assert_eq!(relay.pass().await.unwrap().sent, 1);
    assert!(Outbox::new(db.pool.clone())
        .table("x; DROP TABLE y")
        .unwrap_err()
        .is_config());
    sqlx::query(&format!("DROP SCHEMA {}_app CASCADE", db.name))
        .execute(&db.pool)
        .await
        .unwrap();
}

/// `Outbox::table` "fails, with `is_config`, on any other name: it is written into SQL": a reserved
/// word is refused or works, never a name that every statement then fails on. Was broken: a
/// reserved word passed the check (lowercase letters), and every statement was a syntax error:
/// `CREATE TABLE IF NOT EXISTS user (...`.
#[tokio::test]
async fn a_reserved_word_table_name_is_refused_or_works() {
    let db = Schema::new().await;
    for name in ["user", "order", "select"] {
        match Outbox::new(db.pool.clone()).table(name) {
            Err(e) => assert!(e.is_config(), "{name}: {e}"),
            Ok(outbox) => {
                let migrated = outbox.migrate().await;
                assert!(
                    migrated.is_ok(),
                    "table({name:?}) was accepted, then migrate failed: {:?}",
                    migrated
                        .err()
                        .and_then(|e| std::error::Error::source(&e).map(ToString::to_string))
                );
            }
        }
    }
}

#[tokio::test]
async fn hostile_keys_topics_payloads_and_delays_are_stored_verbatim_without_panics() {
    let db = Schema::new().await;
    let outbox = db.outbox().await.max_payload(64 * 1024);
    let mut tx = db.pool.begin().await.unwrap();
    let key = "';DROP/**/TABLE/**/outbox;--\\$1%s{}";
    let topic = "'); DELETE FROM outbox; -- ünï 🦀";
    let exact = vec![0u8; 64 * 1024];
    outbox.enqueue(&mut tx, topic, key, exact).await.unwrap();
    let long = "k".repeat(tower_once_outbox::MAX_KEY_LEN);
    outbox
        .enqueue(&mut tx, "t", &long, "\0\u{1}")
        .await
        .unwrap();
    assert!(outbox
        .enqueue(&mut tx, "t", "over", vec![0u8; 64 * 1024 + 1])
        .await
        .unwrap_err()
        .is_invalid());
    assert!(outbox
        .enqueue(&mut tx, "t\u{7f}", "del", "{}")
        .await
        .unwrap_err()
        .is_invalid());
    tx.commit().await.unwrap();

    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let relay = OutboxRelay::new(
        outbox.clone(),
        quick(),
        service_fn(move |m: OutboxMessage| {
            s.lock().unwrap().push((
                m.topic().to_owned(),
                m.dedupe_key().to_owned(),
                m.payload().len(),
            ));
            async { Err::<(), _>("é".repeat(5000)) }
        }),
    )
    .unwrap()
    .classify(|_: &Result<(), String>| Action::Retry {
        after: Some(Duration::MAX),
    });
    assert_eq!(relay.pass().await.unwrap().failed, 2);
    let mut seen = seen.lock().unwrap().clone();
    seen.sort();
    assert!(seen.contains(&(topic.to_owned(), key.to_owned(), 64 * 1024)));
    assert!(seen.contains(&("t".to_owned(), long.clone(), 2)));
    // Retry-After: Duration::MAX is capped at a day; the error text at 2 KiB.
    assert_eq!(
        db.scalar(
            "SELECT count(*) FROM outbox WHERE next_attempt_at BETWEEN now() + interval '23 h' \
             AND now() + interval '25 h' AND octet_length(last_error) <= 2048"
        )
        .await,
        2
    );
    assert_eq!(db.scalar("SELECT count(*) FROM outbox").await, 2);
}
