"""Settings of the history's archive tier (control_plane/archiver.py; the layout:
core/archive_layout.py): ``Settings.archive``, env ``WEBHOOKS_ARCHIVE__<FIELD>``."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, SecretStr


class ArchiveSettings(BaseModel):
    """The history's archive tier (control_plane/archiver.py; the layout: core/archive_layout.py)."""

    # Where Parquet files and manifests go: a local directory (the default, so `make run` needs
    # nothing more; relative paths are under the repository) or s3://bucket/prefix on any
    # S3-compatible store (s3_* below).
    uri: str = ".run/archive"
    s3_endpoint: str = ""  # host:port; "" = AWS's
    s3_scheme: Literal["https", "http"] = "https"
    s3_region: str = "us-east-1"
    s3_access_key: str = ""
    s3_secret_key: SecretStr = SecretStr("")
    # An hour is archived once it ended this long ago (its deliveries are final: the retry
    # deadline is 24 h) ...
    archive_after_s: int = Field(default=3 * 24 * 3600, ge=3600)
    # ... and, verified, its hot rows are rewritten to expire this long after release: the hot
    # copy still answers for that while, then only the archive does.
    release_ttl_s: int = Field(default=24 * 3600, ge=1)
    # Rows read from Cassandra per page and buffered per file before a Parquet row group is
    # written: memory is bounded by these, not by the hour's size.
    page_size: int = Field(default=500, ge=1)
    row_group_rows: int = Field(default=5_000, ge=1)
    # The Pushgateway the archiver (a batch job) pushes its outcome to; "" = none.
    pushgateway: str = "127.0.0.1:9091"
