"""Suite-wide test settings."""

import os

from hypothesis import settings

# The suite shares two cores with Kafka, Cassandra and Flink: a per-example time limit would turn
# load into flaky failures. Under CI the examples are derandomized, so a red CI always reproduces.
settings.register_profile("default", deadline=None)
settings.register_profile("ci", deadline=None, derandomize=True)
settings.load_profile("ci" if os.environ.get("CI") else "default")

# The real stack's session fixtures (job, control plane, receiver) serve tests/integration,
# tests/faults and tests/e2e: one plugin, so a session starts each of them once.
pytest_plugins = ["tests.support.stack_fixtures", "tests.support.console_browser"]
