"""The pure domain core: delivery policy, signing, egress rules, fan-out matching, record schemas.

Nothing in this package imports Flink, Kafka, Cassandra or does I/O; clocks and random sources
are arguments, so every rule is tested table-driven without a running system.
"""
