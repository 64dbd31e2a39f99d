//! The worker: reads and takes over entries, runs them on the handler service, and stops
//! gracefully.

use crate::classify::JobClassifier;
use crate::config::WorkerConfig;
use crate::error::WorkerError;
use crate::job::Job;
use crate::report::RunReport;
use crate::run_loop::{RunLoop, Turn};
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use std::fmt;
use std::future::Future;
use std::time::Duration;
use tower_once_retry::classify::Classify;
use tower_service::Service;

/// A Redis Streams consumer that runs each entry on a `tower::Service<Job>`. See the
/// [crate docs](crate) for the semantics.
pub struct Worker<S, C = JobClassifier, Conn = ConnectionManager> {
    config: WorkerConfig,
    service: S,
    classifier: C,
    reader: Conn,
    conn: Conn,
}

impl<S, C, Conn> fmt::Debug for Worker<S, C, Conn> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Worker")
            .field("config", &self.config)
            .field("service", &std::any::type_name::<S>())
            .field("classifier", &std::any::type_name::<C>())
            .field("connection", &std::any::type_name::<Conn>())
            .finish()
    }
}

impl<S> Worker<S> {
    /// A worker on one Redis server, e.g. `redis://127.0.0.1:6379`. It opens two reconnecting
    /// connections (one for the blocking `XREADGROUP`, one for everything else) lazily, so it
    /// starts while Redis is down and recovers on its own after a restart.
    pub fn connect(url: &str, config: WorkerConfig, service: S) -> Result<Self, WorkerError> {
        config.validate().map_err(WorkerError::config)?;
        let client = redis::Client::open(url)?;
        let timeout = config.command_timeout;
        let manager = |response: Duration| {
            let c = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(timeout))
                .set_response_timeout(Some(response))
                .set_number_of_retries(1)
                .set_max_delay(Duration::from_secs(1));
            ConnectionManager::new_lazy_with_config(client.clone(), c)
        };
        let reader = manager(config.effective_block() + timeout)?;
        let conn = manager(timeout)?;
        Self::new(config, reader, conn, service)
    }
}

impl<S> Worker<S, JobClassifier, ClusterConnection> {
    /// A worker on a Redis Cluster, through any of its nodes. Name the stream with a hash tag
    /// (`{jobs}`) so it and its dead-letter stream share a slot.
    pub async fn connect_cluster<I, T>(
        nodes: I,
        config: WorkerConfig,
        service: S,
    ) -> Result<Self, WorkerError>
    where
        I: IntoIterator<Item = T>,
        T: redis::IntoConnectionInfo,
    {
        config.validate().map_err(WorkerError::config)?;
        let nodes: Vec<redis::ConnectionInfo> = nodes
            .into_iter()
            .map(redis::IntoConnectionInfo::into_connection_info)
            .collect::<Result<_, _>>()?;
        let timeout = config.command_timeout;
        let connect = |response: Duration| {
            let nodes = nodes.clone();
            async move {
                redis::cluster::ClusterClientBuilder::new(nodes)
                    .connection_timeout(timeout)
                    .response_timeout(response)
                    .build()?
                    .get_async_connection()
                    .await
            }
        };
        let reader = connect(config.effective_block() + timeout).await?;
        let conn = connect(timeout).await?;
        Self::new(config, reader, conn, service)
    }
}

impl<S, Conn> Worker<S, JobClassifier, Conn> {
    /// A worker over two connections of any kind: `reader` carries only the blocking
    /// `XREADGROUP` (its response timeout must exceed [`WorkerConfig::effective_block`]),
    /// `conn` everything else. Checks the config ([`WorkerError::is_config`]).
    pub fn new(
        config: WorkerConfig,
        reader: Conn,
        conn: Conn,
        service: S,
    ) -> Result<Self, WorkerError> {
        config.validate().map_err(WorkerError::config)?;
        Ok(Self {
            config,
            service,
            classifier: JobClassifier,
            reader,
            conn,
        })
    }
}

impl<S, C, Conn> Worker<S, C, Conn> {
    /// Classifies outcomes with `classifier` instead of [`JobClassifier`].
    pub fn classify<C2>(self, classifier: C2) -> Worker<S, C2, Conn> {
        Worker {
            config: self.config,
            service: self.service,
            classifier,
            reader: self.reader,
            conn: self.conn,
        }
    }

    /// The settings.
    pub fn config(&self) -> &WorkerConfig {
        &self.config
    }

    /// Runs until `shutdown` completes, then stops reading (a read in progress is let finish,
    /// within [`WorkerConfig::effective_block`], and its entries run), waits up to the shutdown
    /// grace for in-flight jobs and returns what happened. Redis errors never end the run: the worker
    /// backs off (up to 5 s) and tries again, recreating the group if Redis lost it.
    pub async fn run<F>(self, shutdown: F) -> RunReport
    where
        F: Future<Output = ()>,
        S: Service<Job> + Clone + Send + 'static,
        S::Future: Send + 'static,
        S::Response: Send + 'static,
        S::Error: fmt::Display + Send + 'static,
        C: Classify<S::Response, S::Error> + Send + Sync + 'static,
        Conn: ConnectionLike + Clone + Send + Sync + 'static,
    {
        let mut run = RunLoop::start(
            self.config,
            self.service,
            self.classifier,
            self.reader,
            self.conn,
        );
        tokio::pin!(shutdown);
        while let Turn::Again = run.turn(shutdown.as_mut()).await {}
        run.finish().await
    }
}
