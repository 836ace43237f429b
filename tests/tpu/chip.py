"""Whether a TPU is here, and the environments the chip tests run programs in.

No TPU is lent to CI, and on a machine with one only a single process at a
time may open the chip: pytest itself must never import jax with a TPU
backend. So the question is asked without opening anything where it can be
(is libtpu installed at all?) and otherwise by a child process that opens
the chip, says what it found and exits, releasing it before any test runs.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

TARGETS = Path(__file__).parent / "targets"

#: Set to 1 to run the chip tests' bodies on CPU (``.ci/run`` does): the same
#: programs, counts and checks, with the CPU's own answers where they differ.
ON_CPU_ENV = "JAXTOP_TPU_TESTS_ON_CPU"
#: Set to 1 where a TPU must be found (tools/tpu/run.sh on the chip): a chip
#: that cannot be opened then fails the tests instead of skipping them.
REQUIRE_ENV = "JAXTOP_REQUIRE_TPU"
#: Opening the chip takes 6-15 s (v5e); a machine busy with other work longer.
DETECT_TIMEOUT_S = 180.0

_PROBE = "import jax; d = jax.devices(); print(d[0].platform, len(d), d[0].device_kind, sep='|')"


@functools.lru_cache(maxsize=None)
def tpu_status() -> tuple[bool, str]:
    """(whether jax finds a TPU here, what was found or why not).

    Asked once per session: a child process opens the chip when libtpu is
    installed, and nothing is started when it is not.
    """
    platforms = os.environ.get("JAX_PLATFORMS", "")
    if platforms and "tpu" not in platforms.split(","):
        return False, f"JAX_PLATFORMS={platforms} keeps jax off any TPU"
    if importlib.util.find_spec("libtpu") is None:
        return False, "no TPU here: libtpu is not installed (jax[tpu] installs it on a TPU machine)"
    try:
        res = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True,
                             timeout=DETECT_TIMEOUT_S, env=dict(os.environ), stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return False, f"libtpu is installed but jax.devices() did not answer within {DETECT_TIMEOUT_S:.0f} s"
    if res.returncode != 0:
        last = (res.stderr.strip().splitlines() or ["no output"])[-1]
        return False, f"libtpu is installed but jax could not open a TPU (another process holding it?): {last[:300]}"
    platform, count, kind = (res.stdout.strip().splitlines() or ["?||"])[-1].split("|", 2)
    if platform != "tpu":
        return False, f"libtpu is installed but jax's devices are {platform}, not tpu"
    return True, f"{count} TPU device(s): {kind}"


def program_env(platform: str, sockdir: Path) -> dict[str, str]:
    """The environment of a program under test on ``platform``."""
    env = dict(os.environ)
    env["JAXTOP_SOCKET_DIR"] = str(sockdir)
    env["JAX_PLATFORMS"] = platform  # on the chip: fail loudly rather than fall back to CPU
    env.pop("JAX_TRANSFER_GUARD", None)
    env.pop("XLA_FLAGS", None)  # one device, as on the chip
    return env


def client_env(sockdir: Path) -> dict[str, str]:
    """The environment of a jaxtop client (ls, snapshot, log) beside the
    program: CPU only, since the program holds the chip and a client that
    imported jax on the TPU would wait for it or fail."""
    env = dict(os.environ)
    env["JAXTOP_SOCKET_DIR"] = str(sockdir)
    env["JAX_PLATFORMS"] = "cpu"
    return env


def last_line(text: str) -> str:
    return (text.strip().splitlines() or [""])[-1]


def samples_of(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if r.get("type") == "sample"]
