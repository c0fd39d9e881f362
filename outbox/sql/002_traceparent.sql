-- The W3C traceparent of the trace the event continues (outbox.producer.write_event: the
-- caller's, or the one the producer library started). NULL: no trace. The connector copies it
-- into the Kafka record's traceparent header; the delivery job reads it from the row.
-- Nullable and without a default: adding it rewrites no row, and a producer that never traces
-- does not name it.
ALTER TABLE webhook_outbox
    ADD COLUMN traceparent text CHECK (traceparent IS NULL OR char_length(traceparent) <= 512);
