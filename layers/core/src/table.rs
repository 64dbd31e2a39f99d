//! A table name written into SQL unquoted, checked first: the Postgres-backed pieces (the
//! outbox, the idempotency store) take a user's table name and render their statements from it
//! once.

use std::fmt;

/// A checked table name: `table` or `schema.table`, each part lowercase ASCII letters, digits
/// and `_`, not starting with a digit, at most 48 bytes (so that names derived from it, such as
/// `{table}_due` for an index or a function, fit Postgres's 63), and not a word Postgres
/// reserves; the schema not one of Postgres's own (`pg_temp`, `pg_catalog`: any `pg_` name).
///
/// ```
/// use tower_once_core::table::TableName;
///
/// let name = TableName::parse("app.mail_out").unwrap();
/// assert_eq!(name.qualified(), "app.mail_out");
/// assert_eq!((name.schema(), name.name()), (Some("app"), "mail_out"));
/// assert!(TableName::parse("user").is_err()); // reserved
/// assert!(TableName::parse("x; DROP TABLE y").is_err());
/// assert!(TableName::parse("pg_temp.mail_out").is_err()); // a system schema
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableName {
    schema: Option<String>,
    name: String,
}

impl TableName {
    /// Checks `full`, `table` or `schema.table`.
    pub fn parse(full: &str) -> Result<Self, TableNameError> {
        let (schema, name) = match full.split_once('.') {
            Some((schema, name)) => (Some(schema), name),
            None => (None, full),
        };
        if let Some(schema) = schema {
            check_ident(schema)?;
            // Postgres reserves `pg_` for its own schemas: `pg_temp` would give each connection
            // a private table (two connections could then both claim one key), and
            // `pg_catalog` and `pg_toast` hold no user tables.
            if schema.starts_with("pg_") {
                return Err(TableNameError { reserved: false });
            }
        }
        check_ident(name)?;
        Ok(Self {
            schema: schema.map(str::to_owned),
            name: name.to_owned(),
        })
    }

    /// The schema, if the name has one.
    pub fn schema(&self) -> Option<&str> {
        self.schema.as_deref()
    }

    /// The table's own name, without the schema.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `schema.` or the empty string: the prefix of an object name qualified like the table.
    pub fn schema_prefix(&self) -> String {
        self.schema
            .as_ref()
            .map_or_else(String::new, |s| format!("{s}."))
    }

    /// The name as written in statements: `schema.table` or `table`.
    pub fn qualified(&self) -> String {
        format!("{}{}", self.schema_prefix(), self.name)
    }
}

impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.qualified())
    }
}

/// Why a table name was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableNameError {
    reserved: bool,
}

impl TableNameError {
    /// What is wrong, in one sentence.
    pub fn as_str(&self) -> &'static str {
        if self.reserved {
            "table name: a word Postgres reserves (user, order, table, ...) cannot be a name here"
        } else {
            "table name: `table` or `schema.table`, lowercase letters, digits and `_`, at most 48 bytes each, the schema not a `pg_` one"
        }
    }
}

impl fmt::Display for TableNameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::error::Error for TableNameError {}

fn check_ident(part: &str) -> Result<(), TableNameError> {
    let mut bytes = part.bytes();
    let first_ok = bytes
        .next()
        .is_some_and(|b| b.is_ascii_lowercase() || b == b'_');
    let rest_ok = bytes.all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if RESERVED.contains(&part) {
        return Err(TableNameError { reserved: true });
    }
    if first_ok && rest_ok && part.len() <= 48 {
        Ok(())
    } else {
        Err(TableNameError { reserved: false })
    }
}

/// PostgreSQL's reserved key words (and those reserved except as function or type names):
/// unquoted, none of them can name a table or schema. Names are written into SQL unquoted,
/// so these are refused up front rather than failing in `migrate`.
const RESERVED: &[&str] = &[
    "all",
    "analyse",
    "analyze",
    "and",
    "any",
    "array",
    "as",
    "asc",
    "asymmetric",
    "authorization",
    "binary",
    "both",
    "case",
    "cast",
    "check",
    "collate",
    "collation",
    "column",
    "concurrently",
    "constraint",
    "create",
    "cross",
    "current_catalog",
    "current_date",
    "current_role",
    "current_schema",
    "current_time",
    "current_timestamp",
    "current_user",
    "default",
    "deferrable",
    "desc",
    "distinct",
    "do",
    "else",
    "end",
    "except",
    "false",
    "fetch",
    "for",
    "foreign",
    "freeze",
    "from",
    "full",
    "grant",
    "group",
    "having",
    "ilike",
    "in",
    "initially",
    "inner",
    "intersect",
    "into",
    "is",
    "isnull",
    "join",
    "lateral",
    "leading",
    "left",
    "like",
    "limit",
    "localtime",
    "localtimestamp",
    "natural",
    "not",
    "notnull",
    "null",
    "offset",
    "on",
    "only",
    "or",
    "order",
    "outer",
    "overlaps",
    "placing",
    "primary",
    "references",
    "returning",
    "right",
    "select",
    "session_user",
    "similar",
    "some",
    "symmetric",
    "system_user",
    "table",
    "tablesample",
    "then",
    "to",
    "trailing",
    "true",
    "union",
    "unique",
    "user",
    "using",
    "variadic",
    "verbose",
    "when",
    "where",
    "window",
    "with",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_are_checked() {
        assert!(TableName::parse("outbox").is_ok());
        assert!(TableName::parse("app.outbox_2").is_ok());
        for bad in [
            "",
            "Outbox",
            "1box",
            "a.b.c",
            "out box",
            "x;drop",
            ".t",
            "t.",
            "order",
            "app.user",
            &"a".repeat(49),
        ] {
            assert!(TableName::parse(bad).is_err(), "{bad:?}");
        }
        assert_eq!(TableName::parse("a.b").unwrap().schema_prefix(), "a.");
        assert_eq!(TableName::parse("b").unwrap().schema_prefix(), "");
    }
}
