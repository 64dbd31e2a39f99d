//! The table: its name, its schema (shipped as `migrations/0001_outbox.sql`) and every query
//! the outbox runs, rendered once from the name.

use crate::error::OutboxError;
use sqlx::PgPool;
use tower_once_core::table::TableName;

/// The shipped migration, for the default table name.
pub(crate) const MIGRATION: &str = include_str!("../migrations/0001_outbox.sql");

/// The outbox's table name, checked by [`TableName`]; `outbox` by default.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Table(TableName);

impl Table {
    pub(crate) fn parse(full: &str) -> Result<Self, OutboxError> {
        TableName::parse(full)
            .map(Self)
            .map_err(|e| OutboxError::config(e.as_str()))
    }

    /// The name as written in queries.
    fn qualified(&self) -> String {
        self.0.qualified()
    }
}

impl Default for Table {
    fn default() -> Self {
        Self(TableName::parse("outbox").unwrap_or_else(|_| unreachable!("a valid name")))
    }
}

/// Every statement the outbox runs, rendered for one table.
#[derive(Debug)]
pub(crate) struct Queries {
    pub(crate) table: String,
    pub(crate) migrate: String,
    pub(crate) enqueue: String,
    pub(crate) existing: String,
    pub(crate) claim: String,
    pub(crate) sent: String,
    pub(crate) failed: String,
    pub(crate) release: String,
    pub(crate) parked: String,
    pub(crate) retry_parked: String,
    pub(crate) stats: String,
    pub(crate) notify: String,
    pub(crate) purge_sent: String,
}

impl Queries {
    pub(crate) fn new(table: &Table) -> Self {
        let t = table.qualified();
        Self {
            migrate: render_migration(table),
            enqueue: format!(
                "INSERT INTO {t} (topic, dedupe_key, payload) VALUES ($1, $2, $3) \
                 ON CONFLICT (dedupe_key) DO NOTHING RETURNING id"
            ),
            existing: format!(
                "SELECT id, topic = $2 AND payload = $3 FROM {t} WHERE dedupe_key = $1"
            ),
            // One statement, so one short transaction: the row locks are held only while the
            // lease is written, never across the send. A row whose earlier lease ran out
            // without an outcome (a relay died mid-send) counts that as an attempt, so a
            // message that kills relays is parked like one that fails.
            claim: format!(
                "WITH due AS ( \
                   SELECT id FROM {t} \
                   WHERE sent_at IS NULL AND parked_at IS NULL AND next_attempt_at <= now() \
                   ORDER BY next_attempt_at, id LIMIT $1 FOR UPDATE SKIP LOCKED) \
                 UPDATE {t} AS o SET \
                   attempts = o.attempts + CASE WHEN o.leased_until IS NULL THEN 0 ELSE 1 END, \
                   last_error = CASE WHEN o.leased_until IS NULL THEN o.last_error \
                     ELSE 'lease expired: a relay stopped before recording an outcome' END, \
                   leased_until = now() + $2 * interval '1 millisecond', \
                   next_attempt_at = now() + $2 * interval '1 millisecond', \
                   lease_token = $3 \
                 FROM due WHERE o.id = due.id \
                 RETURNING o.id, o.topic, o.dedupe_key, o.payload, o.attempts, \
                   (extract(epoch FROM o.created_at) * 1000)::int8"
            ),
            // Not fenced by the lease: the message went out, whoever holds the row now.
            sent: format!(
                "UPDATE {t} SET sent_at = now(), leased_until = NULL, lease_token = NULL \
                 WHERE id = ANY($1) AND sent_at IS NULL"
            ),
            // Fenced: a relay whose lease ran out must not move a row another relay holds.
            failed: format!(
                "UPDATE {t} SET attempts = attempts + $7, last_error = coalesce($2, last_error), \
                   next_attempt_at = now() + $3 * interval '1 millisecond', \
                   parked_at = CASE WHEN $4 OR attempts + $7 >= $5 THEN now() END, \
                   leased_until = NULL, lease_token = NULL \
                 WHERE id = $1 AND lease_token = $6 AND sent_at IS NULL \
                 RETURNING parked_at IS NOT NULL"
            ),
            release: format!(
                "UPDATE {t} SET next_attempt_at = now(), leased_until = NULL, lease_token = NULL \
                 WHERE id = ANY($1) AND lease_token = $2 AND sent_at IS NULL"
            ),
            parked: format!(
                "SELECT id, topic, dedupe_key, payload, attempts, last_error, \
                   (extract(epoch FROM created_at) * 1000)::int8, \
                   (extract(epoch FROM parked_at) * 1000)::int8 \
                 FROM {t} WHERE parked_at IS NOT NULL AND sent_at IS NULL \
                 ORDER BY parked_at, id LIMIT $1"
            ),
            retry_parked: format!(
                "UPDATE {t} SET parked_at = NULL, attempts = 0, next_attempt_at = now(), \
                   leased_until = NULL, lease_token = NULL \
                 WHERE id = $1 AND parked_at IS NOT NULL AND sent_at IS NULL"
            ),
            stats: format!(
                "SELECT \
                   count(*) FILTER (WHERE sent_at IS NULL AND parked_at IS NULL), \
                   count(*) FILTER (WHERE sent_at IS NULL AND parked_at IS NULL AND leased_until > now()), \
                   count(*) FILTER (WHERE parked_at IS NOT NULL AND sent_at IS NULL), \
                   count(*) FILTER (WHERE sent_at IS NOT NULL) \
                 FROM {t}"
            ),
            notify: format!(
                "SELECT pg_notify('tower_once_outbox_' || '{t}'::regclass::oid::text, '')"
            ),
            purge_sent: format!(
                "DELETE FROM {t} WHERE id IN ( \
                   SELECT id FROM {t} WHERE sent_at < now() - $1 * interval '1 millisecond' \
                   LIMIT $2)"
            ),
            table: t,
        }
    }
}

/// The shipped migration with the table's name in place of `outbox`.
fn render_migration(table: &Table) -> String {
    if *table == Table::default() {
        return MIGRATION.to_owned();
    }
    let name = table.0.name();
    let schema = &table.0.schema_prefix();
    // Every occurrence of the identifier `outbox` in the file is a table-derived name; the
    // comment lines are dropped so that this replacement never meets prose.
    MIGRATION
        .lines()
        .filter(|line| !line.starts_with("--"))
        .map(|line| {
            // A trailing space so that a name ending the line is matched too.
            format!("{line} ")
                .replace(" outbox_", &format!(" {schema}{name}_"))
                .replace(" outbox ", &format!(" {schema}{name} "))
                .trim_end()
                .to_owned()
        })
        .map(|line| {
            // Index and trigger names are never schema-qualified in their own CREATE.
            line.replace(
                &format!("INDEX IF NOT EXISTS {schema}{name}_"),
                &format!("INDEX IF NOT EXISTS {name}_"),
            )
            .replace(
                &format!("TRIGGER {schema}{name}_notify AFTER"),
                &format!("TRIGGER {name}_notify AFTER"),
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Creates the table, its indexes and its NOTIFY trigger if missing, one migration at a time.
///
/// One simple-protocol query: Postgres runs its statements as one implicit transaction, so the
/// transaction-scoped advisory lock taken first keeps concurrent starts from racing, and an
/// error rolls everything back without leaving the pooled connection inside a transaction.
pub(crate) async fn migrate(pool: &PgPool, queries: &Queries) -> Result<(), OutboxError> {
    // Any fixed number works; this one stays out of the way of the application's own locks.
    let sql = format!(
        "SET LOCAL client_min_messages = warning;\nSELECT pg_advisory_xact_lock(7208364147126150911);\n{}",
        queries.migrate
    );
    sqlx::raw_sql(&sql).execute(pool).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_table_name_is_a_config_error() {
        // The rules themselves are `TableName`'s, tested in the core crate.
        assert!(Table::parse("app.outbox_2").is_ok());
        let error = Table::parse("user").unwrap_err();
        assert!(error.to_string().contains("reserves"), "{error}");
    }

    #[test]
    fn the_default_table_runs_the_shipped_file() {
        assert_eq!(Queries::new(&Table::default()).migrate, MIGRATION);
    }

    #[test]
    fn another_table_renames_every_object() {
        let sql = Queries::new(&Table::parse("app.mail_out").unwrap_or_default()).migrate;
        assert!(sql.contains("CREATE TABLE IF NOT EXISTS app.mail_out ("));
        assert!(sql.contains("CREATE INDEX IF NOT EXISTS mail_out_due ON app.mail_out "));
        assert!(sql.contains("FUNCTION app.mail_out_notify()"));
        assert!(sql.contains("TRIGGER mail_out_notify AFTER INSERT ON app.mail_out"));
        assert!(sql.contains("EXECUTE FUNCTION app.mail_out_notify()"));
        assert!(sql.contains("'tower_once_outbox_'"));
        assert!(!sql.contains(" outbox"), "{sql}");
    }
}
