"""Benchmarks: small CLIs that measure one thing on 127.0.0.1 and print key=value lines."""
