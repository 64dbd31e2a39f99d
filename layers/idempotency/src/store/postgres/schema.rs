//! The table: its schema (shipped as `migrations/0001_idempotency_records.sql`) and every
//! statement the store runs, rendered once from the table's name.

use super::error::from_sqlx;
use crate::store::StoreError;
use sqlx::PgPool;
use tower_once_core::table::TableName;

/// The shipped migration, for the default table name.
pub(super) const MIGRATION: &str = include_str!("../../../migrations/0001_idempotency_records.sql");

/// The default table name.
pub const DEFAULT_TABLE: &str = "idempotency_records";

/// The fence of every write by a claim's owner: the record is in progress under this token
/// and its lease has not run out (an expired record counts as absent, even before it is
/// purged).
const FENCE: &str =
    "key = $1 AND token = $2 AND state = 'in_progress' AND expires_at > clock_timestamp()";

/// Every statement the store runs, rendered for one table.
#[derive(Debug)]
pub(super) struct Queries {
    pub(super) table: String,
    pub(super) migrate: String,
    pub(super) claim: String,
    pub(super) live: String,
    pub(super) lock_function: String,
    pub(super) record: String,
    pub(super) complete: String,
    pub(super) complete_in: String,
    pub(super) inspect: String,
    pub(super) settled: String,
    pub(super) release: String,
    pub(super) extend: String,
    pub(super) purge: String,
}

impl Queries {
    pub(super) fn new(table: &TableName) -> Self {
        let t = table.qualified();
        let columns =
            "state = $3, expires_at = clock_timestamp() + $4 * interval '1 millisecond', \
                       status = $5, header_names = $6, header_values = $7, body = $8, \
                       trailer_names = $9, trailer_values = $10, completed_at = clock_timestamp()";
        Self {
            migrate: render_migration(table),
            // NOTE: a live record (a replay, a conflict, a mismatch) is read by plain SQL; the
            // claim function, which reads it again before claiming, runs only when there is
            // none (a one-time filter: not called at all otherwise).
            claim: format!(
                "WITH live AS ( \
                   SELECT false AS claimed, state, fingerprint, \
                     greatest(0, ceil(extract(epoch FROM expires_at - clock_timestamp()) * 1000))::int8 \
                       AS lease_ms, \
                     status, header_names, header_values, body, trailer_names, trailer_values \
                   FROM {t} WHERE key = $1 AND expires_at > clock_timestamp()) \
                 SELECT * FROM live \
                 UNION ALL \
                 SELECT claimed, state, fingerprint, lease_ms, status, header_names, header_values, \
                   body, trailer_names, trailer_values FROM {}{}_claim($1, $2, $3, $4, $5) \
                 WHERE NOT EXISTS (SELECT 1 FROM live)",
                table.schema_prefix(),
                table.name()
            ),
            // NOTE: the transactional claim's first read: a live record (replay, conflict,
            // mismatch) answers without a transaction; none opens the handler's transaction.
            live: format!(
                "SELECT false AS claimed, state, fingerprint, \
                   greatest(0, ceil(extract(epoch FROM expires_at - clock_timestamp()) * 1000))::int8 \
                     AS lease_ms, \
                   status, header_names, header_values, body, trailer_names, trailer_values \
                 FROM {t} WHERE key = $1 AND expires_at > clock_timestamp()"
            ),
            lock_function: format!("{}{}_lock", table.schema_prefix(), table.name()),
            // NOTE: the transactional record, inserted completed in the handler's transaction
            // under the key's lock. An expired row is replaced; a live one (written by a claim
            // that did not take the lock: another store mode on the same table) is not, and
            // the caller rolls back.
            record: format!(
                "INSERT INTO {t} AS r (key, token, state, expires_at, status, header_names, \
                   header_values, body, trailer_names, trailer_values, fingerprint, claimed_at, \
                   completed_at) \
                 VALUES ($1, $2, $3, clock_timestamp() + $4 * interval '1 millisecond', $5, $6, \
                   $7, $8, $9, $10, $11, clock_timestamp(), clock_timestamp()) \
                 ON CONFLICT (key) DO UPDATE SET token = excluded.token, state = excluded.state, \
                   expires_at = excluded.expires_at, status = excluded.status, \
                   header_names = excluded.header_names, header_values = excluded.header_values, \
                   body = excluded.body, trailer_names = excluded.trailer_names, \
                   trailer_values = excluded.trailer_values, fingerprint = excluded.fingerprint, \
                   claimed_at = excluded.claimed_at, completed_at = excluded.completed_at \
                 WHERE r.expires_at <= clock_timestamp()"
            ),
            complete: format!("UPDATE {t} SET {columns} WHERE {FENCE}"),
            // NOTE: in the handler's transaction, the completion also answers which top-level
            // transaction wrote it (a savepoint's included), so that the layer can ask, once
            // the handler has returned, whether that transaction committed (`settled`).
            complete_in: format!(
                "UPDATE {t} SET {columns} WHERE {FENCE} RETURNING pg_current_xact_id()::text::int8"
            ),
            settled: format!(
                "SELECT token = $2 AS mine, state, pg_xact_status($3::text::xid8) AS xact \
                 FROM {t} WHERE key = $1"
            ),
            // NOTE: why a completion in the handler's transaction changed nothing, read with a
            // lock so that it is the row as last committed: at `REPEATABLE READ` and above, a
            // row changed since the transaction's snapshot (a lease renewal) fails here with a
            // serialization error instead of being read from the snapshot, where its lease may
            // have run out although the claim is still this request's.
            inspect: format!("SELECT token = $2 AS mine, state FROM {t} WHERE key = $1 FOR SHARE"),
            release: format!("DELETE FROM {t} WHERE {FENCE}"),
            // NOTE: a row locked by another transaction is the owner's own handler completing
            // it in its transaction (nothing else writes a live claim): waiting for that lock
            // would hold a connection until the handler commits, so the renewal skips it and
            // answers "still ours" from the row as last committed.
            extend: format!(
                "WITH mine AS (SELECT key FROM {t} WHERE {FENCE}), \
                 free AS (SELECT key FROM {t} WHERE {FENCE} FOR UPDATE SKIP LOCKED), \
                 renewed AS (UPDATE {t} AS r \
                   SET expires_at = clock_timestamp() + $3 * interval '1 millisecond' \
                   FROM free WHERE r.key = free.key RETURNING 1) \
                 SELECT EXISTS (SELECT 1 FROM renewed) \
                   OR (EXISTS (SELECT 1 FROM mine) AND NOT EXISTS (SELECT 1 FROM free))"
            ),
            // NOTE: `clock_timestamp()` is volatile, so compared directly it is a filter that
            // reads the whole `expires_at` index, and `key IN (...)` lets the planner hash-join
            // a sequential scan; read once (an init plan) it bounds the index scan, and the
            // keys as an array are looked up through the primary key.
            purge: format!(
                "DELETE FROM {t} WHERE key = ANY (ARRAY( \
                   SELECT key FROM {t} WHERE expires_at <= (SELECT clock_timestamp()) \
                   ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED)) \
                 AND expires_at <= clock_timestamp()"
            ),
            table: t,
        }
    }
}

/// The shipped migration with the table's name in place of `idempotency_records`.
fn render_migration(table: &TableName) -> String {
    if table.qualified() == DEFAULT_TABLE {
        return MIGRATION.to_owned();
    }
    let qualified = table.qualified();
    let prefix = table.schema_prefix();
    let name = table.name();
    // NOTE: the derived names are set aside first, so that the table's own name, replaced
    // last, never lands inside them (a table named `idempotency_records` in another schema
    // once gave `app.app.idempotency_records_claim` and a schema-qualified index name).
    // Index names are never schema-qualified in their own CREATE; the functions' are.
    MIGRATION
        .replace("idempotency_records_expires", "\u{1}expires\u{1}")
        .replace("idempotency_records_claim", "\u{1}claim\u{1}")
        .replace("idempotency_records_lock", "\u{1}lock\u{1}")
        .replace("idempotency_records", &qualified)
        .replace("\u{1}expires\u{1}", &format!("{name}_expires"))
        .replace("\u{1}claim\u{1}", &format!("{prefix}{name}_claim"))
        .replace("\u{1}lock\u{1}", &format!("{prefix}{name}_lock"))
}

/// Creates the table, its index and its two functions if missing, one migration at a time.
///
/// One simple-protocol query: Postgres runs its statements as one implicit transaction, so the
/// transaction-scoped advisory lock taken first keeps concurrent starts from racing.
pub(super) async fn migrate(pool: &PgPool, queries: &Queries) -> Result<(), StoreError> {
    // Any fixed number; the outbox's migration takes another.
    let sql = format!(
        "SET LOCAL client_min_messages = warning;\nSELECT pg_advisory_xact_lock(7208364147126150912);\n{}",
        queries.migrate
    );
    sqlx::raw_sql(&sql).execute(pool).await.map_err(from_sqlx)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_table_runs_the_shipped_file() {
        let table = TableName::parse(DEFAULT_TABLE).unwrap();
        assert_eq!(Queries::new(&table).migrate, MIGRATION);
    }

    #[test]
    fn the_default_name_in_another_schema_is_qualified_once() {
        let table = TableName::parse("app.idempotency_records").unwrap();
        let sql = Queries::new(&table).migrate;
        assert!(sql.contains("CREATE TABLE IF NOT EXISTS app.idempotency_records ("));
        assert!(sql.contains(
            "CREATE INDEX IF NOT EXISTS idempotency_records_expires ON app.idempotency_records"
        ));
        assert!(sql.contains("FUNCTION app.idempotency_records_claim("));
        assert!(sql.contains("FUNCTION app.idempotency_records_lock("));
        assert!(!sql.contains("app.app."), "{sql}");
        assert!(
            !sql.contains("EXISTS app.idempotency_records_expires"),
            "{sql}"
        );
    }

    #[test]
    fn another_table_renames_every_object() {
        let table = TableName::parse("app.idem").unwrap();
        let sql = Queries::new(&table).migrate;
        assert!(sql.contains("CREATE TABLE IF NOT EXISTS app.idem ("));
        assert!(sql.contains("CREATE INDEX IF NOT EXISTS idem_expires ON app.idem (expires_at)"));
        assert!(sql.contains("FUNCTION app.idem_claim("));
        assert!(sql.contains("FUNCTION app.idem_lock("));
        assert!(sql.contains("INSERT INTO app.idem AS r"));
        assert!(!sql.contains("idempotency_records"), "{sql}");
        assert!(Queries::new(&table)
            .claim
            .contains("FROM app.idem_claim($1"));
    }
}
