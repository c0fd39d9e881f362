"""The archive tier, its own processes: the writer (`python -m control_plane.archive.writer`: the job's
facts from Kafka to Parquet) and the audit (`python -m control_plane.archive.audit`), the Parquet
row schemas and the archive's storage."""
