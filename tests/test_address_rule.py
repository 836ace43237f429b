"""Which buffer addresses the agent asks: only those jaxlib tells without
making a new Array (one the program would see in ``jax.live_arrays()``).

Measured, with ``unsafe_buffer_pointer()`` of a jit output and an eager
output: jaxlib 0.4.30 through 0.10.0 add an Array per asked output, 0.10.1
and 0.10.2 none; per-shard Arrays made by a host read add none anywhere.
The end-to-end check is ``tests/test_shard_aliases.py``, which CI runs on the
oldest jax too.
"""

from __future__ import annotations

import pytest

from jaxtop.probes import jax_memory as jm
from jaxtop.probes.jax_memory import JaxMemoryProbe
from jaxtop.probes.jaxstate import version_tuple


@pytest.mark.parametrize("text, want", [("0.10.1", (0, 10, 1)), ("0.4.30", (0, 4, 30)), ("0.10.1rc1", (0, 10, 1)),
                                        ("0.5.0.dev20250101", (0, 5, 0)), ("junk", ())])
def test_jaxlib_versions_read_for_the_address_rule(text, want):
    assert version_tuple(text) == want
    assert (version_tuple(text) >= jm.ASKS_WITHOUT_ARRAYS) is (want >= (0, 10, 1))


def test_addresses_are_asked_only_where_jaxlib_makes_no_array_for_it(jax_cpu):
    import jaxlib.version

    assert jm.addresses_askable() is (version_tuple(jaxlib.version.__version__) >= (0, 10, 1))
    a = (jax_cpu.numpy.ones(4) + 1).block_until_ready()  # an executable's output
    before = len(jax_cpu.live_arrays())
    probe = JaxMemoryProbe()
    try:
        got = jm.ready_address(a)
        assert len(jax_cpu.live_arrays()) == before  # the program's view is unchanged either way
        assert got == (a.unsafe_buffer_pointer() if jm.addresses_askable() else jm.UNASKED)
    finally:
        probe.close()
