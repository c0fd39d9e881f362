"""Settings of the history's archive tier (docs/archive.md; the writer:
control_plane/archive/writer.py; the layout: core/archive_layout.py): ``Settings.archive``, env
``WEBHOOKS_ARCHIVE__<FIELD>``."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, SecretStr, model_validator


class ArchiveSettings(BaseModel):
    """The history's archive tier (docs/archive.md)."""

    # Where Parquet files and their commit records go: a local directory (the default, so `make
    # run` needs nothing more; relative paths are under the repository) or s3://bucket/prefix on
    # any S3-compatible store (s3_* below).
    uri: str = ".run/archive"
    s3_endpoint: str = ""  # host:port; "" = AWS's
    s3_scheme: Literal["https", "http"] = "https"
    s3_region: str = "us-east-1"
    s3_access_key: str = ""
    s3_secret_key: SecretStr = SecretStr("")
    # The delivery job sends every history fact to the archive facts topic (core/archive_facts.py)
    # and writes the rows the archive keeps (events, attempts) to expire after hot_ttl_s. False:
    # no facts, and those rows live the whole history window in Cassandra (no archive tier).
    stream: bool = True
    # How long events and attempt rows live in Cassandra. This is the archive's outage budget: a
    # fact the writer has not archived within it would outlive its hot row only in the archive
    # facts topic (kept as long: stack/topics.py), so alerts fire long before (ArchiveLagHigh).
    # The delivery rows themselves (creation and status cells) live the whole window: reads find
    # a delivery's hour and tenant there, and the dispatcher's re-fan-out check its final status.
    hot_ttl_s: int = Field(default=4 * 24 * 3600, ge=2 * 3600)
    # The archive writer (control_plane/archive/writer.py): a file set is written and the
    # consumer's offsets committed once this many facts are buffered or the oldest waited this long.
    roll_facts: int = Field(default=100_000, ge=1)
    roll_s: float = Field(default=60.0, gt=0)
    writer_group: str = "webhooks-archive-writer"
    # The audit (control_plane/archive/audit.py) checks an hour once it ended this long ago: its
    # deliveries are final (the retry deadline is 24 h) and their rows still hot (hot_ttl_s), so
    # a gap it finds is repaired from Cassandra.
    audit_after_s: int = Field(default=26 * 3600, ge=3600)
    # The audit's reads of Cassandra's indexes: rows per page.
    page_size: int = Field(default=500, ge=1)
    # The Pushgateway the writer and the audit push their state to; "" = none.
    pushgateway: str = "127.0.0.1:9091"

    @model_validator(mode="after")
    def _audit_before_expiry(self) -> ArchiveSettings:
        if self.audit_after_s + 12 * 3600 > self.hot_ttl_s:
            raise ValueError(f"archive.hot_ttl_s ({self.hot_ttl_s}) must exceed archive.audit_after_s"
                             f" ({self.audit_after_s}) by at least 12 h: a gap the audit finds is repaired"
                             " from the hot rows")
        return self
