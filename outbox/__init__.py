"""The producer side of the platform: the PostgreSQL transactional outbox.

- :mod:`outbox.producer` -- ``write_event``, called inside the application's own transaction.
- :mod:`outbox.migrate` -- creates the database, the table, the publication and the replication
  slot Debezium streams from (``python -m outbox.migrate``; ``make run`` calls it).
- :mod:`outbox.housekeeping` -- deletes published rows past the retention.

Nothing here imports Flink, Kafka or Cassandra: an application needs only psycopg.
"""
