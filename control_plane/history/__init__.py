"""Delivery history: reads over both tiers, manual replay and bulk recovery, ordering keys,
reconciliation, stats from Prometheus and read-only queries over the archive."""
