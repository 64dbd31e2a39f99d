//! Redis Cluster (worker crate docs: with a hash tag, a stream and its dead-letter
//! stream share a slot and dead-lettering stays one transaction; without one the worker falls back
//! to `XADD` then `XACK`), on a local three-master cluster.

mod support;

use std::time::Duration;
use support::{config, eventually, handler, pending, start, xadd, Log};
use tower_once_test_support::redis::RedisCluster;
use tower_once_worker::dead_letter::DeadLetters;
use tower_once_worker::redis;
use tower_once_worker::{Job, JobError, JobId, Worker};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_three_master_cluster_runs_takes_over_and_dead_letters() {
    let cluster = RedisCluster::start();
    let client = redis::cluster::ClusterClient::new(cluster.urls()).unwrap();
    let mut conn = client.get_async_connection().await.unwrap();
    let log = Log::default();
    let svc = handler(&log, |job| {
        match (job.job_id().as_str(), job.deliveries()) {
            ("perm", _) => Err(JobError::permanent("no")),
            ("flaky", 1) => Err(JobError::transient("once")),
            _ => Ok(Duration::ZERO),
        }
    });
    // Several streams, so they land on different masters; a hash tag keeps each stream and
    // its dead-letter stream in one slot.
    let streams = ["{jobs-a}", "{jobs-b}", "{jobs-c}"];
    let mut workers = Vec::new();
    for stream in streams {
        for id in ["ok", "perm", "flaky"] {
            xadd(&mut conn, stream, &format!("{stream}{id}"), "{}").await;
        }
        let svc = tower::ServiceBuilder::new()
            .map_request(|job: Job| {
                // Strip the stream prefix so one handler serves all three.
                let id = job.job_id().as_str();
                let short = id.rsplit('}').next().unwrap_or(id).to_owned();
                Job::new(
                    job.stream_id(),
                    JobId::new(short).unwrap(),
                    job.payload().clone(),
                    job.deliveries(),
                )
            })
            .service(svc.clone());
        workers.push(start!(Worker::connect_cluster(
            cluster.urls(),
            config(stream, "c1"),
            svc
        )
        .await
        .unwrap()));
    }
    for stream in streams {
        let dead = DeadLetters::new(conn.clone(), stream);
        eventually("a dead letter per stream", || async {
            dead.count().await.unwrap() == 1
        })
        .await;
        eventually("nothing pending", || {
            let mut c = conn.clone();
            async move { pending(&mut c, stream).await == 0 }
        })
        .await;
        let letter = dead.list("-", 1).await.unwrap().remove(0);
        assert_eq!(letter.reason, "permanent");
        assert!(
            dead.requeue(&letter.dead_id).await.unwrap().is_some(),
            "same-slot requeue works on Cluster"
        );
    }
    eventually("requeued ones dead-lettered again", || async {
        log.calls("perm") == 6
    })
    .await;
    for w in workers {
        w.stop().await;
    }
    assert_eq!(log.calls("ok"), 3);
    let mut flaky = log.deliveries("flaky");
    flaky.sort_unstable();
    assert_eq!(flaky, [1, 1, 1, 2, 2, 2], "each flaky job taken over once");
}

/// Without a hash tag, a stream and its dead-letter stream live in different cluster slots: the
/// cluster refuses the `MULTI`, and the worker falls back to `XADD` then `XACK`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untagged_stream_on_a_cluster_still_dead_letters() {
    let cluster = RedisCluster::start();
    let slot = |key: &str| {
        cluster.nodes[0]
            .cli(&["CLUSTER", "KEYSLOT", key])
            .trim()
            .to_owned()
    };
    assert_ne!(
        slot("plainjobs"),
        slot("plainjobs:dead"),
        "the test needs two slots"
    );
    let client = redis::cluster::ClusterClient::new(cluster.urls()).unwrap();
    let mut conn = client.get_async_connection().await.unwrap();
    let log = Log::default();
    let svc = handler(&log, |_| Err(JobError::permanent("no")));
    xadd(&mut conn, "plainjobs", "p", "{}").await;
    let worker = start!(
        Worker::connect_cluster(cluster.urls(), config("plainjobs", "c"), svc)
            .await
            .unwrap()
    );
    let dead = DeadLetters::new(conn.clone(), "plainjobs");
    eventually("dead-lettered", || async {
        dead.count().await.unwrap() == 1
    })
    .await;
    eventually("acked", || {
        let mut c = conn.clone();
        async move { pending(&mut c, "plainjobs").await == 0 }
    })
    .await;
    assert_eq!(worker.stop().await.dead_lettered, 1);
    assert_eq!(log.calls("p"), 1);
    assert_eq!(dead.list("-", 1).await.unwrap()[0].reason, "permanent");
}
