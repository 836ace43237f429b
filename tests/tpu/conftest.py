"""The chip tests run each body on the TPU where there is one, and on CPU
when ``JAXTOP_TPU_TESTS_ON_CPU=1`` asks for it; otherwise they skip, saying why."""

from __future__ import annotations

import os

import pytest

from tpu.chip import ON_CPU_ENV, REQUIRE_ENV, tpu_status


@pytest.fixture(params=["tpu", "cpu"])
def platform(request) -> str:
    """The platform the test's programs run on: ``tpu`` or ``cpu``."""
    if request.param == "tpu":
        present, why = tpu_status()
        if not present:
            if os.environ.get(REQUIRE_ENV) == "1":
                pytest.fail(f"{REQUIRE_ENV}=1 but {why}", pytrace=False)
            pytest.skip(why)
    elif os.environ.get(ON_CPU_ENV) != "1":
        pytest.skip(f"the CPU run of the chip tests is asked for with {ON_CPU_ENV}=1 (.ci/run sets it)")
    return request.param
