"""The dispatcher's payload cache: bounded by bytes, least recently used evicted first."""

from operators.payload_cache import PayloadCache


def test_the_cache_stays_within_its_bytes_and_evicts_the_least_recently_used() -> None:
    c = PayloadCache(max_bytes=10)
    c.put("a", b"1234")
    c.put("b", b"1234")
    assert c.get("a") == b"1234"  # a is now the most recent
    c.put("c", b"1234")  # 12 bytes: b goes
    assert (c.get("b"), c.get("a"), c.get("c"), c.bytes, len(c)) == (None, b"1234", b"1234", 8, 2)


def test_replacing_an_entry_counts_its_bytes_once_and_an_oversized_payload_is_not_cached() -> None:
    c = PayloadCache(max_bytes=10)
    c.put("a", b"12345")
    c.put("a", b"123")
    assert c.bytes == 3
    c.put("big", b"x" * 11)
    assert c.get("big") is None and c.bytes == 3
