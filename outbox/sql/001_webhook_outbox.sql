-- The transactional outbox: a producer inserts one row in the same transaction that changes its
-- business state (outbox.producer.write_event); Debezium streams committed inserts from the WAL to
-- the events topic. Rows are never updated; housekeeping deletes them after a retention
-- (outbox.housekeeping), and the connector skips those deletes.
CREATE TABLE webhook_outbox (
    -- Unique: a retried producer transaction cannot emit the same business fact twice.
    event_id         text        PRIMARY KEY CHECK (length(event_id) BETWEEN 1 AND 200),
    tenant_id        text        NOT NULL,
    event_type       text        NOT NULL,
    schema_version   text        NOT NULL,
    object_id        text,
    object_version   bigint,
    occurred_at      timestamptz NOT NULL,
    -- The exact body bytes every receiver is sent and every signature covers (canonical JSON
    -- written by the producer library). Kafka's default 1 MiB record limit, with the payload
    -- base64-encoded in the Debezium envelope, sets this hard cap: a larger row is refused here,
    -- at the producer's INSERT, instead of stopping the connector. The job's own limit
    -- (WEBHOOKS_INGEST__MAX_PAYLOAD_BYTES, 256 KiB by default) is lower; rows between the two
    -- reach the dead-letter topic with reason payload_too_large.
    payload          bytea       NOT NULL CHECK (octet_length(payload) <= 655360),
    -- Layout of this row as core.ingest reads it: 2 = payload is bytea (base64 in the envelope).
    envelope_version smallint    NOT NULL DEFAULT 2,
    -- When the row was written (not when its transaction committed): housekeeping's clock.
    created_at       timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE INDEX webhook_outbox_created_at ON webhook_outbox (created_at);

-- Housekeeping's proof that a row was published: each run records the server's WAL position;
-- once the replication slot has confirmed past a mark, every transaction committed before the
-- mark was taken has been streamed (outbox.housekeeping).
CREATE TABLE outbox_purge_marks (
    taken_at timestamptz PRIMARY KEY DEFAULT clock_timestamp(),
    lsn      pg_lsn      NOT NULL
);
