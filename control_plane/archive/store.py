"""The archive tier's storage: one pyarrow filesystem (a local directory or any S3-compatible
store) under a root, and the few operations the archive writer, the audit and the readers need.

Every byte of archive I/O passes here, through pyarrow's own filesystems: no S3 SDK, and nothing
downloaded at run time (the query engine gets Arrow tables read here, not URLs).

Publishing makes a file appear whole or not at all (:meth:`ArchiveStore.put`): locally it is
written under a temporary name and renamed; on S3 an upload is atomic by itself. Readers trust
only files a segment's commit record lists, and the record is published last, so a torn or
abandoned file is never taken for part of an hour (core/archive_layout.py).
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.fs as pafs  # type: ignore[import-untyped]
import pyarrow.parquet as pq  # type: ignore[import-untyped]

from control_plane.archive.rows import SCHEMAS
from core import archive_layout as layout
from core.settings import REPO_ROOT, ArchiveSettings


class ArchiveUnavailable(Exception):
    """The archive store did not answer (an S3 server down, a directory unwritable)."""


class ArchiveStore:
    def __init__(self, fs: pafs.FileSystem, root: str) -> None:
        self.fs = fs
        self.root = root.rstrip("/")
        self._local = isinstance(fs, pafs.LocalFileSystem)

    @staticmethod
    def from_settings(s: ArchiveSettings) -> ArchiveStore:
        if s.uri.startswith("s3://"):
            fs = pafs.S3FileSystem(
                access_key=s.s3_access_key or None, secret_key=s.s3_secret_key.get_secret_value() or None,
                endpoint_override=s.s3_endpoint or None, scheme=s.s3_scheme, region=s.s3_region,
                # A server that is down must fail a run within seconds, not retry for minutes.
                connect_timeout=5, request_timeout=30,
                retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=3))
            return ArchiveStore(fs, s.uri.removeprefix("s3://"))
        root = Path(s.uri.removeprefix("file://"))
        return ArchiveStore(pafs.LocalFileSystem(), str(root if root.is_absolute() else REPO_ROOT / root))

    def _abs(self, path: str) -> str:
        return f"{self.root}/{path}"

    def new_run_id(self) -> str:
        return uuid.uuid4().hex[:12]

    # -- writing ------------------------------------------------------------------------------
    def put_bytes(self, tmp: str, data: bytes) -> None:
        full = self._abs(tmp)
        try:
            if self._local:
                self.fs.create_dir(full.rsplit("/", 1)[0], recursive=True)
            with self.fs.open_output_stream(full) as out:
                out.write(data)
        except OSError as exc:
            raise ArchiveUnavailable(f"archive store: cannot write {tmp}: {exc}") from exc

    def put(self, final: str, data: bytes) -> None:
        """``data`` under ``final``, whole or not at all: locally written under a temporary name
        and renamed; on S3 one upload, which makes the object appear only once complete (a
        temporary object and a server-side copy would triple the requests)."""
        if self._local:
            tmp = layout.tmp_path(final, self.new_run_id())
            self.put_bytes(tmp, data)
            self.publish(tmp, final)
        else:
            self.put_bytes(final, data)

    def publish(self, tmp: str, final: str) -> None:
        try:
            self.fs.move(self._abs(tmp), self._abs(final))
        except OSError as exc:
            raise ArchiveUnavailable(f"archive store: cannot publish {final}: {exc}") from exc

    # -- reading ------------------------------------------------------------------------------
    def files(self, prefix: str) -> list[str]:
        """Files under ``prefix`` (relative paths); none if it does not exist."""
        sel = pafs.FileSelector(self._abs(prefix), recursive=True, allow_not_found=True)
        try:
            infos = self.fs.get_file_info(sel)
        except OSError as exc:
            raise ArchiveUnavailable(f"archive store: cannot list {prefix}: {exc}") from exc
        cut = len(self.root) + 1
        return sorted(i.path[cut:] for i in infos if i.type == pafs.FileType.File)

    def sizes(self, prefix: str) -> dict[str, int]:
        """Size of every file under ``prefix`` (relative paths); empty if it does not exist."""
        sel = pafs.FileSelector(self._abs(prefix), recursive=True, allow_not_found=True)
        try:
            infos = self.fs.get_file_info(sel)
        except OSError as exc:
            raise ArchiveUnavailable(f"archive store: cannot list {prefix}: {exc}") from exc
        cut = len(self.root) + 1
        return {i.path[cut:]: int(i.size or 0) for i in infos if i.type == pafs.FileType.File}

    def commits(self, hour_ms: int, bucket: int) -> list[layout.Commit]:
        """The segments committed to one (hour, bucket): the only files a reader trusts."""
        out = []
        for path in self.files(layout.segments_prefix(hour_ms, bucket)):
            if not layout.is_tmp(path) and path.endswith(".json"):
                raw = self.read_bytes(path)
                if raw is not None:
                    out.append(layout.Commit.from_json(raw))
        return out

    def read_kind(self, hour_ms: int, bucket: int, kind: str, columns: list[str] | None = None,
                  filters: list[tuple[str, str, object]] | None = None) -> pa.Table:
        """Every committed row of one kind in one (hour, bucket), unreduced (a fact may be there
        twice: archive_facts.latest)."""
        tables = [self.read_table(f.path, columns=columns, filters=filters)
                  for c in self.commits(hour_ms, bucket) for f in c.files_of(kind)]
        if not tables:
            schema = SCHEMAS[kind]
            return schema.empty_table() if columns is None else pa.schema([schema.field(c)
                                                                           for c in columns]).empty_table()
        return pa.concat_tables(tables)

    def read_bytes(self, path: str) -> bytes | None:
        try:
            if self.fs.get_file_info(self._abs(path)).type != pafs.FileType.File:
                return None
            with self.fs.open_input_stream(self._abs(path)) as f:
                return bytes(f.read())
        except OSError as exc:
            raise ArchiveUnavailable(f"archive store: cannot read {path}: {exc}") from exc

    def read_table(self, path: str, columns: list[str] | None = None,
                   filters: list[tuple[str, str, object]] | None = None) -> pa.Table:
        try:
            return pq.read_table(self._abs(path), filesystem=self.fs, columns=columns,
                                 filters=filters)  # type: ignore[arg-type]
        except OSError as exc:
            raise ArchiveUnavailable(f"archive store: cannot read {path}: {exc}") from exc
