"""The endpoint driver's public import path, ``core.endpoint_driver``, over its package.

Callers import from the package; values pickled while the driver was one module
(``core.endpoint_driver.Wake`` and so on) must still load. Nothing of the driver is in Flink state
today (keyed state holds core.dispatch, core.records, core.breaker and core.ratelimit values and
plain tuples), but a class path in any pickle must keep resolving.
"""

from __future__ import annotations

import pickle

import core.endpoint_driver as driver
from core.endpoint_driver import Decision, Load, StorageHealth, Wake

# pickle.dumps(..., protocol=4) of these values, made by the single-module driver.
OLD_DECISION = (b'\x80\x04\x95\xb2\x00\x00\x00\x00\x00\x00\x00\x8c\x14core.endpoint_driver\x94\x8c\x08Decision\x94'
                b'\x93\x94)\x81\x94}\x94(\x8c\x07actions\x94]\x94h\x00\x8c\x04Load\x94\x93\x94)\x81\x94}\x94\x8c\x0b'
                b'delivery_id\x94\x8c\x05dlv_1\x94sba\x8c\x07signals\x94]\x94\x8c\x04wake\x94h\x00\x8c\x04Wake\x94'
                b'\x93\x94)\x81\x94}\x94(\x8c\x05at_ms\x94\x8a\x06\x00h\xe5\xcf\x8b\x01\x8c\x06reason\x94\x8c\x0e'
                b'next retry due\x94ubub.')
OLD_STORAGE_HEALTH = (b'\x80\x04\x95@\x00\x00\x00\x00\x00\x00\x00\x8c\x14core.endpoint_driver\x94\x8c\rStorageHealth'
                      b'\x94\x93\x94)\x81\x94}\x94\x8c\nlast_ok_ms\x94K*sb.')


def test_values_pickled_at_the_old_module_path_load() -> None:
    assert pickle.loads(OLD_DECISION) == Decision(actions=[Load("dlv_1")],
                                                  wake=Wake(1_700_000_000_000, "next retry due"))
    assert pickle.loads(OLD_STORAGE_HEALTH) == StorageHealth(last_ok_ms=42)


def test_the_package_exports_the_public_surface() -> None:
    for name in driver.__all__:
        assert getattr(driver, name) is not None, name
    assert {"EndpointDriver", "DriverPolicy", "Decision", "Wake", "Check", "Persist", "Reserve", "Send", "Record",
            "Load", "StorageHealth", "IoKind", "Action"} <= set(driver.__all__)
