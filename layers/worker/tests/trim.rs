//! Trimming (worker crate docs: `Producer::trim_acknowledged` trims with `MINID`
//! below every group's oldest pending or undelivered entry, never a pending one), against a real
//! `redis-server`.

mod support;

use support::{create_group, manager, xadd, Tap};
use tower_once_test_support::redis::RedisServer;
use tower_once_worker::redis::{self, Value};
use tower_once_worker::{JobId, Producer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trimming_never_deletes_a_pending_or_undelivered_entry() {
    let server = RedisServer::start();
    let mut conn = manager(&server.url()).await;
    let producer = Producer::new(conn.clone(), "jobs");
    create_group(&mut conn, "jobs", "workers").await;
    let mut ids = Vec::new();
    for i in 0..6 {
        ids.push(
            producer
                .enqueue(&JobId::new(format!("t{i}")).unwrap(), "{}")
                .await
                .unwrap(),
        );
    }
    // Deliver 4, acknowledge the 1st, 2nd and 4th: the 3rd stays pending, 5 and 6 undelivered.
    let _: Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg("workers")
        .arg("c")
        .arg("COUNT")
        .arg(4)
        .arg("STREAMS")
        .arg("jobs")
        .arg(">")
        .query_async(&mut conn)
        .await
        .unwrap();
    let _: u64 = redis::cmd("XACK")
        .arg("jobs")
        .arg("workers")
        .arg(&ids[0])
        .arg(&ids[1])
        .arg(&ids[3])
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        producer.trim_acknowledged().await.unwrap(),
        2,
        "only the two below the pending one"
    );
    let left: Vec<(String, Vec<String>)> = redis::cmd("XRANGE")
        .arg("jobs")
        .arg("-")
        .arg("+")
        .query_async(&mut conn)
        .await
        .unwrap();
    let left: Vec<&String> = left.iter().map(|(id, _)| id).collect();
    assert_eq!(left, ids[2..].iter().collect::<Vec<_>>());
    // No group at all: nothing is known to be processed, nothing is trimmed.
    let other = Producer::new(conn.clone(), "lonely");
    other
        .enqueue(&JobId::new("x").unwrap(), "{}")
        .await
        .unwrap();
    assert_eq!(other.trim_acknowledged().await.unwrap(), 0);
}

/// `Producer::trim_acknowledged` never trims away the entries of a group created just before it:
/// the trim is one script, so a group created right before it (`XGROUP CREATE <stream> <group> 0
/// MKSTREAM`, what `Worker::run` does with the default `group_start` `0`, at the last moment a race
/// could) is seen by it, and none can be created in the middle. Was broken: it read `XINFO GROUPS`,
/// then sent `XTRIM MINID` as a separate command, and a worker of a new group starting in between
/// had every entry it should get trimmed away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trimming_sees_a_group_created_just_before_it() {
    let server = RedisServer::start();
    let mut conn = manager(&server.url()).await;
    // Group "workers" has read and acknowledged three entries.
    create_group(&mut conn, "trim", "workers").await;
    let mut ids = Vec::new();
    for i in 0..3 {
        ids.push(xadd(&mut conn, "trim", &format!("job-{i}"), "{}").await);
    }
    let _: Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg("workers")
        .arg("c")
        .arg("STREAMS")
        .arg("trim")
        .arg(">")
        .query_async(&mut conn)
        .await
        .unwrap();
    let _: Value = redis::cmd("XACK")
        .arg("trim")
        .arg("workers")
        .arg(&ids)
        .query_async(&mut conn)
        .await
        .unwrap();
    // A new worker group ("mailers") starts between the trim's XINFO GROUPS and its XTRIM.
    let mut tap = Tap::new(manager(&server.url()).await);
    let mut create = redis::cmd("XGROUP");
    create
        .arg("CREATE")
        .arg("trim")
        .arg("mailers")
        .arg("0")
        .arg("MKSTREAM");
    tap.before_cmd = "EVALSHA";
    *tap.before.lock().unwrap() = Some(create);
    let trimmed = Producer::new(tap, "trim")
        .trim_acknowledged()
        .await
        .unwrap();
    let read: Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg("mailers")
        .arg("m")
        .arg("STREAMS")
        .arg("trim")
        .arg(">")
        .query_async(&mut conn)
        .await
        .unwrap();
    let got = match read {
        Value::Array(streams) => match streams.into_iter().next() {
            Some(Value::Array(mut pair)) if pair.len() == 2 => match pair.pop() {
                Some(Value::Array(entries)) => entries.len(),
                _ => 0,
            },
            _ => 0,
        },
        _ => 0,
    };
    assert_eq!(
        got, 3,
        "group \"mailers\" (created at 0) lost entries it never saw; trim deleted {trimmed}"
    );
}
