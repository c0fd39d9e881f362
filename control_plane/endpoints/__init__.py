"""Endpoints: the service (create, update, rotate, verify, delete), the dispatcher's signals, schema
pins and the per-endpoint health reports."""
