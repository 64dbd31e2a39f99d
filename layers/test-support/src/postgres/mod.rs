//! A PostgreSQL database or schema of the test's own, on the machine's server, dropped with
//! `psql` when dropped (so even after a panic).
//!
//! The server is `PG_URL` (a server URL, default `postgres://postgres@127.0.0.1:5432`); a
//! schema is made in the database `DATABASE_URL` (default
//! `postgres://postgres@127.0.0.1:5432/test`). `.ci/test` sets both up.

mod server;

pub use self::server::PostgresServer;

use std::process::Command;

/// The server databases are created on: `PG_URL`, default `postgres://postgres@127.0.0.1:5432`.
pub fn server_url() -> String {
    let url =
        std::env::var("PG_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".to_owned());
    url.trim_end_matches('/').to_owned()
}

/// The database schemas are created in: `DATABASE_URL`, default
/// `postgres://postgres@127.0.0.1:5432/test`.
pub fn database_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// Runs `sql` on `url` with `psql`, stopping at the first error, and returns its output.
///
/// # Panics
///
/// If `psql` cannot run or `sql` fails.
fn psql(url: &str, flags: &str, sql: &str) -> String {
    let out = Command::new("psql")
        .arg(url)
        .args([flags, "-v", "ON_ERROR_STOP=1", "-c", sql])
        .output()
        .expect("run psql");
    assert!(
        out.status.success(),
        "{sql}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Runs `sql` on `url` with `psql`, ignoring the outcome (for drops).
fn psql_quietly(url: &str, sql: &str) {
    let _ = Command::new("psql")
        .arg(url)
        .args(["-q", "-c", sql])
        .output();
}

/// A random name with `prefix`, unique to this process and this call.
fn unique(prefix: &str) -> String {
    format!("{prefix}_{}_{}", std::process::id(), fastrand::u64(..))
}

/// A database of its own on [`server_url`], dropped (with `FORCE`) when this is.
#[derive(Debug)]
pub struct Database {
    /// Its name.
    pub name: String,
    server: String,
}

impl Database {
    /// Creates an empty database with a fresh name.
    ///
    /// # Panics
    ///
    /// If the server refuses.
    pub fn create() -> Self {
        let db = Self {
            name: unique("tower_once"),
            server: server_url(),
        };
        psql(
            &format!("{}/postgres", db.server),
            "-q",
            &format!("CREATE DATABASE {}", db.name),
        );
        db
    }

    /// Its URL.
    pub fn url(&self) -> String {
        format!("{}/{}", self.server, self.name)
    }

    /// One value from `sql`, as text ("" for no row).
    pub fn query(&self, sql: &str) -> String {
        psql(&self.url(), "-qtAX", sql)
    }

    /// One count from `sql` (0 for no row).
    pub fn count(&self, sql: &str) -> u64 {
        self.query(sql).parse().unwrap_or(0)
    }
}

impl Drop for Database {
    fn drop(&mut self) {
        psql_quietly(
            &format!("{}/postgres", self.server),
            &format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name),
        );
    }
}

/// A schema of its own in [`database_url`], dropped (with `CASCADE`) when this is.
#[derive(Debug)]
pub struct Schema {
    /// Its name.
    pub name: String,
}

impl Schema {
    /// Creates an empty schema with a fresh name.
    ///
    /// # Panics
    ///
    /// If the server refuses.
    pub fn create() -> Self {
        let schema = Self {
            name: unique("tower_once_test"),
        };
        psql(
            &database_url(),
            "-q",
            &format!("CREATE SCHEMA {}", schema.name),
        );
        schema
    }
}

impl Drop for Schema {
    fn drop(&mut self) {
        psql_quietly(
            &database_url(),
            &format!("DROP SCHEMA IF EXISTS {} CASCADE", self.name),
        );
    }
}
