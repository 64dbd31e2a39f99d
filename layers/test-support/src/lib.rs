//! Fixtures shared by tower-once's tests and benches (unpublished, like tower's `tower-test`):
//! real processes and databases of their own, created for one test and gone when dropped.
//!
//! - [`redis`]: a private `redis-server` ([`RedisServer`](redis::RedisServer)) and a local
//!   three-master Redis Cluster ([`RedisCluster`](redis::RedisCluster)), on loopback, without
//!   persistence, killed on drop. They need `redis-server` and `redis-cli` on `PATH`.
//! - [`postgres`]: a database ([`Database`](postgres::Database)) or a schema
//!   ([`Schema`](postgres::Schema)) of its own on the machine's PostgreSQL, dropped with `psql`
//!   on drop (so even after a panic). They need `psql` on `PATH`.
//! - [`ports`]: a free loopback port, and a bounded wait until something listens on one.
//! - [`examples`]: the path of an example binary, built if `cargo test` did not build it.
//!
//! `.ci/test` installs and starts what these need.

pub mod examples;
pub mod ports;
pub mod postgres;
pub mod redis;
