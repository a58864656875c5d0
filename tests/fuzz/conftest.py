"""Fixtures for the fuzz suite: the API tests' own (no model loading, a fresh cache, raw ASGI requests in the
test's transaction, the scripted engine), hypothesis' settings, and the suite's figures in the summary."""
import os
from collections import Counter

import pytest
from hypothesis import HealthCheck, settings

from tests.api.conftest import (fake_rt, fresh_locmem, no_model_loading, raw_asgi_requests,  # noqa: F401
                                smollm2_tokenizer)
from tests.api.fake_engine import call

# Examples per route in the normal test run (the in-process suite); `make fuzz` runs the long campaign.
EXAMPLES = int(os.environ.get("METRALE_FUZZ_EXAMPLES", "150"))
# The same examples every run (a failure reproduces); METRALE_FUZZ_RANDOM=1 draws new ones.
settings.register_profile("metrale-fuzz", deadline=None, database=None, print_blob=True,
                          derandomize=os.environ.get("METRALE_FUZZ_RANDOM") != "1",
                          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                                 HealthCheck.data_too_large, HealthCheck.large_base_example])

# Answers by route and status, for the summary.
FIGURES: Counter = Counter()


@pytest.fixture
def conversation(fake_rt) -> str:
    """A stored conversation of the default tenant, for the routes that update one."""
    return call("POST", "/v1/conversations", {}).json()["id"]


def pytest_terminal_summary(terminalreporter):
    if FIGURES:
        total = sum(FIGURES.values())
        by_status = Counter()
        for (_, status), n in FIGURES.items():
            by_status[status] += n
        terminalreporter.write_line(f"fuzz: {total} requests; by status: "
                                    + ", ".join(f"{s}: {n}" for s, n in sorted(by_status.items())))
