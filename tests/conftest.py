"""Shared fixtures: a private socket directory and real JAX child processes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

TARGETS = Path(__file__).parent / "targets"
PY = sys.executable


def _jax_version() -> tuple[int, ...]:
    from importlib.metadata import PackageNotFoundError, version

    from jaxtop.probes.jaxstate import version_tuple

    try:
        return version_tuple(version("jax"))
    except PackageNotFoundError:
        return ()


#: jax names the compiled function in its compile events from 0.6.2; before,
#: jaxtop reports recompiles as n/a with that reason (tests expect either).
NAMES_COMPILES = _jax_version() >= (0, 6, 2)
RECOMPILES_NA = "recompiles  n/a: this jax does not name compiled functions"


@pytest.fixture(autouse=True, scope="session")
def _profiles_out_of_the_checkout(tmp_path_factory):
    """The agent and `jaxtop demo`'s profiling strategy write memory profiles
    into the current directory unless told where: a test run must not leave
    them in the checkout. A test of the default unsets this itself."""
    old = os.environ.get("JAXTOP_PROFILE_DIR")
    os.environ["JAXTOP_PROFILE_DIR"] = str(tmp_path_factory.mktemp("profiles"))
    yield
    if old is None:
        os.environ.pop("JAXTOP_PROFILE_DIR", None)
    else:
        os.environ["JAXTOP_PROFILE_DIR"] = old


@pytest.fixture
def sockdir(monkeypatch):
    # A short path: AF_UNIX socket paths are limited to 108 bytes.
    path = tempfile.mkdtemp(prefix="jt-")
    monkeypatch.setenv("JAXTOP_SOCKET_DIR", path)
    yield Path(path)
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def child_env(sockdir):
    env = dict(os.environ)
    env["JAXTOP_SOCKET_DIR"] = str(sockdir)
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    env["JAX_PLATFORMS"] = "cpu"
    env.pop("JAX_TRANSFER_GUARD", None)
    env.pop("JAXTOP_MAX_PAUSE_MS", None)  # the agent's default limit, whatever this shell set
    return env


def wait_for(predicate, timeout=30.0, interval=0.05, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}")


class Targets:
    """Starts `jaxtop run` children and cleans them up."""

    def __init__(self, env, sockdir):
        self.env = env
        self.sockdir = sockdir
        self.procs: list[subprocess.Popen] = []

    def run(self, *args, env=None, wait_socket=True, **kw):
        proc = subprocess.Popen(
            [PY, "-m", "jaxtop", "run", *map(str, args)],
            env=env or self.env,
            stdout=kw.pop("stdout", subprocess.PIPE),
            stderr=kw.pop("stderr", subprocess.PIPE),
            **kw,
        )
        self.procs.append(proc)
        if wait_socket:
            sock = self.sockdir / f"{proc.pid}.sock"
            wait_for(lambda: sock.exists() or proc.poll() is not None, what="agent socket")
            assert proc.poll() is None, proc.communicate()
        return proc

    def wait_ready(self, proc, marker=b"ready", timeout=60.0):
        """Read the target's stdout until ``marker`` (jax imported, loop starting)."""
        import select

        deadline = time.monotonic() + timeout
        fd = proc.stdout.fileno()
        seen = b""
        while marker not in seen:
            left = deadline - time.monotonic()
            assert left > 0 and proc.poll() is None, f"target never printed {marker!r}: {seen[-500:]!r}"
            if select.select([fd], [], [], min(left, 0.5))[0]:
                seen += os.read(fd, 65536)

    def cleanup(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            try:
                p.communicate(timeout=10)
            except Exception:
                pass


@pytest.fixture
def targets(child_env, sockdir):
    t = Targets(child_env, sockdir)
    yield t
    t.cleanup()


def jaxtop_cmd(*args, env, timeout=60, **kw):
    return subprocess.run(
        [PY, "-m", "jaxtop", *map(str, args)], env=env, capture_output=True, timeout=timeout, **kw
    )


@pytest.fixture
def jax_cpu():
    """jax, imported in this process (CPU backend), or the test is skipped."""
    jax = pytest.importorskip("jax")
    return jax


@pytest.fixture
def utc(monkeypatch):
    """Times drawn in UTC (snapshots show clock times)."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    time.tzset()


@pytest.fixture
def rig():
    """Makes relays on pipes (tests/relay_rig.py's Rig), closed after the test."""
    from relay_rig import Rig

    made = []

    def make(passed=()):
        r = Rig(passed)
        made.append(r)
        return r

    yield make
    for r in made:
        r.close()
