"""A holders profile read from the live arrays in chunks (many arrays), beside
jaxlib's own profile (few): the same sites, bytes and counts, with the
interpreter handed back every CHUNK arrays; in a real agent, the record says
which way it was read and that executables are n/a then."""

from __future__ import annotations

import json

import numpy as np
import pytest

from jaxtop.probes import holders_scan
from jaxtop.probes.jax_memory import JaxMemoryProbe
from jaxtop.probes.pprof import aggregate_profile


@pytest.fixture(scope="module")
def jax():
    jax = pytest.importorskip("jax")
    if jax.default_backend() != "cpu":
        pytest.skip("these tests describe the CPU backend")
    return jax


def make_small(jax, n):
    return [jax.device_put(np.full((4,), i, np.float32)) for i in range(n)]  # SITE small


def make_big(jax, n):
    return [jax.numpy.ones((256,)) * i for i in range(n)]  # SITE big


def test_the_same_sites_as_jaxlib_s_profile_in_chunks(jax):
    small, big = make_small(jax, 1500), make_big(jax, 700)
    jax.block_until_ready((small, big))
    probe = JaxMemoryProbe()
    probe.scan_live_arrays(now=1.0)
    pauses = []
    ours = holders_scan.totals_from_arrays(probe.arrays, probe.device_labels(), chunk=250,
                                           pause=lambda s: pauses.append(s))
    theirs = aggregate_profile(bytes(jax.profiler.device_memory_profile()))
    def by_line(totals):
        return {(k[0].rsplit("/", 1)[-1], k[2]): (s.bytes, s.count, dict(s.devices)) for k, s in totals.sites.items()
                if k[0].endswith("test_holders_scan.py")}
    assert by_line(ours) == by_line(theirs)
    assert {(f, fn) for f, fn in by_line(ours)} >= {("test_holders_scan.py", "make_small.<listcomp>"),
                                                    ("test_holders_scan.py", "make_big.<listcomp>")}
    # Handed back at least every 250 arrays: every piece is a few hundred arrays.
    assert len(pauses) >= (1500 + 700) // 250
    assert ours.by_device.keys() == theirs.by_device.keys()
    probe.close()


def test_an_agent_reads_a_program_of_many_arrays_from_its_arrays(targets, tmp_path):
    program = tmp_path / "many.py"
    program.write_text(
        "import time\nimport numpy as np\nimport jax\n"
        "kept = [jax.device_put(np.full((4,), i, np.float32)) for i in range(3000)]  # SITE\n"
        "print('ready', flush=True)\ntime.sleep(12)\n")
    log = tmp_path / "many.jsonl"
    proc = targets.run("--log", log, program)
    proc.communicate(timeout=120)
    profiles = [r["holders"] for r in map(json.loads, log.read_text().splitlines()) if "holders" in r
                and "sites" in r["holders"]]
    last = profiles[-1]
    assert last["method"] == "arrays" and last["executables"] is None
    site = next(s for s in last["sites"] if s["site"] == "many.py:4")
    assert site["count"] == 3000 and site["bytes"] == 3000 * 16
