-- tower-once: the idempotency records of PostgresStore, one row per key.
-- PostgresStore::migrate runs this under an advisory lock; to run it with your own migrations,
-- take PostgresStore::migration(), which has your table's name in place of idempotency_records.
CREATE TABLE IF NOT EXISTS idempotency_records (
    key            bytea       PRIMARY KEY CHECK (length(key) = 32),
    token          uuid        NOT NULL,
    state          text        NOT NULL CHECK (state IN ('in_progress', 'completed', 'not_replayable')),
    fingerprint    bytea       NOT NULL CHECK (length(fingerprint) = 32),
    expires_at     timestamptz NOT NULL,
    status         int2,
    header_names   text[],
    header_values  bytea[],
    body           bytea,
    trailer_names  text[],
    trailer_values bytea[],
    claimed_at     timestamptz NOT NULL,
    completed_at   timestamptz
);
CREATE INDEX IF NOT EXISTS idempotency_records_expires ON idempotency_records (expires_at);
CREATE OR REPLACE FUNCTION idempotency_records_claim(
    p_key bytea, p_token uuid, p_fingerprint bytea, p_lease_ms int8, p_wait_ms int8)
RETURNS TABLE (claimed boolean, state text, fingerprint bytea, lease_ms int8, status int2,
    header_names text[], header_values bytea[], body bytea,
    trailer_names text[], trailer_values bytea[])
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz;
BEGIN
    -- A row locked by a handler's open transaction (between its completion and its commit) is
    -- waited for at most p_wait_ms, the store's statement timeout: a caller that gave up must
    -- not leave its backend, and with it its pooled connection, waiting for that commit.
    PERFORM set_config('lock_timeout', p_wait_ms::text, true);
    FOR attempt IN 1..16 LOOP
        v_now := clock_timestamp();
        -- A live record is returned as it is, read-only: a replay or a duplicate writes
        -- nothing and waits for no lock (a record a handler is completing in its open
        -- transaction still reads as in progress until that commits).
        RETURN QUERY SELECT false, r.state, r.fingerprint,
            greatest(0, ceil(extract(epoch FROM r.expires_at - v_now) * 1000))::int8,
            r.status, r.header_names, r.header_values, r.body, r.trailer_names, r.trailer_values
        FROM idempotency_records AS r WHERE r.key = p_key AND r.expires_at > v_now;
        IF FOUND THEN
            RETURN;
        END IF;
        -- Absent or expired: claim it. A row that changed since the read (claimed or completed
        -- by another, or locked by a handler's transaction, then committed) is not taken: the
        -- next round reads it.
        INSERT INTO idempotency_records AS r (key, token, state, fingerprint, expires_at, claimed_at)
        VALUES (p_key, p_token, 'in_progress', p_fingerprint,
            v_now + p_lease_ms * interval '1 millisecond', v_now)
        ON CONFLICT (key) DO UPDATE SET token = excluded.token, state = 'in_progress',
            fingerprint = excluded.fingerprint, expires_at = excluded.expires_at, status = NULL,
            header_names = NULL, header_values = NULL, body = NULL, trailer_names = NULL,
            trailer_values = NULL, claimed_at = v_now, completed_at = NULL
        WHERE r.expires_at <= v_now;
        IF FOUND THEN
            -- One fresh claim in eight deletes up to sixteen expired rows (two per claim on
            -- average, through the expires_at index): expired rows cannot pile up, and the
            -- index's dead entries are walked an eighth as often.
            IF random() < 0.125 THEN
                DELETE FROM idempotency_records AS d WHERE d.key IN (
                    SELECT e.key FROM idempotency_records AS e WHERE e.expires_at <= v_now
                    ORDER BY e.expires_at LIMIT 16 FOR UPDATE SKIP LOCKED)
                AND d.expires_at <= v_now;
            END IF;
            RETURN QUERY SELECT true, NULL::text, NULL::bytea, NULL::int8, NULL::int2,
                NULL::text[], NULL::bytea[], NULL::bytea, NULL::text[], NULL::bytea[];
            RETURN;
        END IF;
    END LOOP;
    RAISE EXCEPTION 'idempotency claim: the record changed under each of sixteen tries';
END
$$;
-- A transactional store's claim (PostgresStore::transactional): called as the handler's
-- transaction begins, it takes the key's transaction-scoped advisory lock (held until that
-- transaction commits or rolls back, a crash or a lost connection included) and fails at once
-- when another transaction holds it (SQLSTATE TO409: a duplicate in progress), or when a live
-- record committed since the caller looked (TO200: read it again). The lock's high bits are the
-- table's oid: one table is one lock space whatever name reaches it.
CREATE OR REPLACE FUNCTION idempotency_records_lock(p_key bytea, p_lock int8)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF NOT pg_try_advisory_xact_lock(
            p_lock # (('idempotency_records'::regclass)::oid::int8 << 32)) THEN
        RAISE EXCEPTION USING ERRCODE = 'TO409', MESSAGE = 'idempotency key in progress';
    END IF;
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        -- This transaction's snapshot was taken before the lock, so a record the lock's last
        -- holder committed may be invisible to it; the primary key's index is not: an insert
        -- that conflicts with a row the snapshot cannot see is a serialization failure. The
        -- probe is undone with its subtransaction.
        BEGIN
            INSERT INTO idempotency_records AS r
                (key, token, state, fingerprint, expires_at, claimed_at)
            VALUES (p_key, '00000000-0000-0000-0000-000000000000', 'in_progress',
                decode(repeat('00', 32), 'hex'), clock_timestamp(), clock_timestamp())
            ON CONFLICT (key) DO NOTHING;
            RAISE EXCEPTION USING ERRCODE = 'TO000';
        EXCEPTION
            WHEN serialization_failure THEN
                RAISE EXCEPTION USING ERRCODE = 'TO200', MESSAGE = 'idempotency record exists';
            WHEN SQLSTATE 'TO000' THEN
                NULL;
        END;
    END IF;
    IF EXISTS (SELECT 1 FROM idempotency_records AS r
               WHERE r.key = p_key AND r.expires_at > clock_timestamp()) THEN
        RAISE EXCEPTION USING ERRCODE = 'TO200', MESSAGE = 'idempotency record exists';
    END IF;
END
$$;
