"""Test settings: PA_TEST_SEED fixes the random cases' seed (printed in the header and in every
failure); PA_TEST_SCALE multiplies the number of random cases."""

import os
import random

import pytest

SEED = int(os.environ.get("PA_TEST_SEED", random.SystemRandom().randrange(1 << 31)))
SCALE = float(os.environ.get("PA_TEST_SCALE", "1"))


def pytest_report_header(config):
    return f"pagedattn tests: PA_TEST_SEED={SEED} PA_TEST_SCALE={SCALE:g}"


def cases(n: int) -> int:
    return max(1, round(n * SCALE))


@pytest.fixture
def seed(request):
    """A seed per test, derived from the run's and the test's name, shown on failure."""
    derived = random.Random(f"{SEED}:{request.node.nodeid}").randrange(1 << 31)
    request.node.user_properties.append(("seed", derived))
    return derived


def pytest_runtest_makereport(item, call):
    if call.excinfo is not None and call.when == "call":
        for name, value in item.user_properties:
            if name == "seed":
                item.add_report_section(
                    "call", "seed", f"PA_TEST_SEED={SEED} (this test's seed {value})"
                )
