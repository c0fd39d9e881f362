"""The shapes of the identifiers tenants and producers send, shared by the control plane's checks
and the outbox producer library so neither accepts a name the other would refuse."""

from __future__ import annotations

import re

# Event types are dotted lower-case names (`invoice.paid`); a subscription filter may end in `.*`
# for a prefix, or be `*` for every type (core.fanout.filter_accepts gives these their meaning).
EVENT_TYPE = re.compile(r"[a-z0-9_-]+(\.[a-z0-9_-]+)*")
# Ids the platform or a tenant chooses (endpoint ids, event ids, metadata keys).
ID = re.compile(r"[A-Za-z0-9_-]{1,128}")
TENANT_ID = re.compile(r"[a-z0-9][a-z0-9_-]{2,63}")
