-- tower-once-outbox schema for the default table name `outbox`, in the current schema.
-- `Outbox::migrate` runs these same statements (for any table name) under an advisory lock;
-- copy this file into your own migrations instead if you prefer (sqlx migrate, refinery, ...).
-- Needs PostgreSQL 14 or later (CREATE OR REPLACE TRIGGER).
CREATE TABLE IF NOT EXISTS outbox (
    id              BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    topic           TEXT        NOT NULL,
    dedupe_key      TEXT        NOT NULL UNIQUE,
    payload         BYTEA       NOT NULL,
    created_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    attempts        INTEGER     NOT NULL DEFAULT 0,
    last_error      TEXT,
    next_attempt_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    leased_until    TIMESTAMPTZ,
    lease_token     BIGINT,
    sent_at         TIMESTAMPTZ,
    parked_at       TIMESTAMPTZ
);
CREATE INDEX IF NOT EXISTS outbox_due ON outbox (next_attempt_at, id)
    WHERE sent_at IS NULL AND parked_at IS NULL;
CREATE INDEX IF NOT EXISTS outbox_parked ON outbox (parked_at, id)
    WHERE parked_at IS NOT NULL AND sent_at IS NULL;
CREATE INDEX IF NOT EXISTS outbox_sent ON outbox (sent_at)
    WHERE sent_at IS NOT NULL;
CREATE OR REPLACE FUNCTION outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('tower_once_outbox_' || TG_RELID::text, '');
    RETURN NULL;
END
$$;
CREATE OR REPLACE TRIGGER outbox_notify AFTER INSERT ON outbox
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify();
