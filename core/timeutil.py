"""Time conversions shared by records and stores (UTC, unix milliseconds)."""

from __future__ import annotations

from datetime import UTC, datetime


def ms_to_iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds").replace(
        "+00:00", "Z"
    )


def iso_to_ms(value: str) -> int:
    """Parse an RFC 3339 timestamp; a value without a zone is refused rather than guessed."""
    dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
    if dt.tzinfo is None:
        raise ValueError(f"timestamp {value!r} has no time zone")
    return int(dt.timestamp() * 1000)
