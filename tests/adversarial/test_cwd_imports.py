"""Adversarial: modules planted in the working directory or beside a recording.

``python -m`` and ``python -c`` put the working directory first on
``sys.path``. The replay indexer used to start as ``python -m
jaxtop.dashboard.sources.replay_cache``: replaying a recording from a shared
directory ran whatever ``numpy.py`` was there, as the user. Here every
Python child jaxtop starts (the replay indexer, ``jaxtop serve``'s dashboard,
the demo workload, gdb's embedded Python when injecting, the stderr relay)
runs with a ``numpy.py``, ``json.py``, ``jaxtop.py``, ``runpy.py`` and
``re.py`` in its working directory and in the recording's directory, each of
which leaves a marker file when imported. No marker may appear, and each
feature must still work.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import PY, TARGETS, wait_for
from jaxtop import cli
from jaxtop.dashboard.model import Model
from jaxtop.dashboard.sources import ReplaySource
from jaxtop.testing import synthetic
from jaxtop.wire import paths, protocol

#: Modules a child would import early: the runner, the stdlib's json and re, numpy, jaxtop itself.
PLANTED = ("numpy", "json", "jaxtop", "runpy", "re")


@pytest.fixture
def markers(tmp_path) -> Path:
    path = tmp_path / "markers"
    path.mkdir()
    return path


def plant(folder: Path, markers: Path) -> Path:
    """``folder`` with a module of each planted name that leaves a marker."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in PLANTED:
        (folder / f"{name}.py").write_text(
            f"open({str(markers / name)!r} + '-' + __import__('os').getcwd().replace('/', '_'), 'a').write('x')\n"
            f"raise ImportError('planted {name}.py was imported from {folder}')\n")
    return folder


def left(markers: Path) -> list[str]:
    return sorted(os.listdir(markers))


def recording(path: Path, count: int = 400) -> Path:
    lines = [protocol.encode(synthetic.hello(7, 2, 1000.0))]
    lines += [protocol.encode(rec) for rec in synthetic.samples(7, 2, 1000.0, count)]
    path.write_bytes(b"".join(lines))
    return path


def jaxtop_isolated(*args, cwd, env=None, timeout=120):
    """The CLI as its console script runs it: nothing on sys.path from ``cwd``
    (``python -m jaxtop`` would itself import the planted modules)."""
    return subprocess.run([PY, "-I", "-m", "jaxtop", *map(str, args)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


# ------------------------------------------------------------ the helper

def test_python_command_leaves_out_the_working_directory(tmp_path, markers, monkeypatch):
    here = plant(tmp_path / "here", markers)
    monkeypatch.chdir(here)
    # As `python -m …` or `python -c …` started from there would have it.
    monkeypatch.setattr(sys, "path", ["", str(here), "."] + sys.path)
    argv = paths.python_command("jaxtop", "ls")
    assert argv[:3] == [sys.executable, "-I", "-c"]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, JAXTOP_SOCKET_DIR=str(tmp_path / "sock")))
    assert res.returncode == 0, res.stderr
    assert "No instrumented JAX processes" in res.stdout
    assert left(markers) == []


# ------------------------------------------------------------ the replay indexer

def test_the_replay_indexer_imports_nothing_from_the_working_or_the_recordings_directory(tmp_path, markers,
                                                                                         monkeypatch):
    shared = plant(tmp_path / "shared", markers)
    rec = recording(shared / "rec.jsonl")
    monkeypatch.chdir(plant(tmp_path / "cwd", markers))
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    monkeypatch.setenv("JAXTOP_CACHE_DIR", str(cache))
    src = ReplaySource(str(rec), start_playing=False, background_min_bytes=0)  # the separate indexer, however small
    try:
        assert src._builder is not None, src.index_error
        src.start(Model(), lambda: None)
        wait_for(lambda: src.index is not None or src.index_error is not None, timeout=60, what="the index")
        assert src.index_error is None, src.index_error
        assert src.index.length == 401
    finally:
        src.stop()
    assert left(markers) == []


# ------------------------------------------------------------ jaxtop serve

def test_the_served_dashboard_imports_nothing_from_the_working_directory(tmp_path, markers, monkeypatch, capsys):
    """`jaxtop serve` hands textual-serve a command line, which a shell runs in
    the server's working directory for each browser. The command is run
    here as the server would, asking for an export instead of the
    dashboard (which needs a browser at the other end)."""
    from jaxtop.cli import serve

    shared = plant(tmp_path / "shared", markers)
    rec = recording(shared / "rec.jsonl")
    commands = []

    class Server:
        def serve_socket(self, sock):
            sock.close()

    def make_server(command, *args, **kw):
        commands.append(command)
        return Server()

    monkeypatch.setattr(serve, "make_server", make_server)
    assert cli.main(["serve", "replay", str(rec)]) == 0
    argv = shlex.split(commands[0])
    assert argv[-2:] == ["replay", str(rec)], argv
    out = tmp_path / "out.csv"
    command = shlex.join(argv[:-2] + ["export", str(rec), "--format", "csv", "-o", str(out)])
    res = subprocess.run(command, shell=True, cwd=shared, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "401 records" in res.stderr and out.read_text().count("\n") > 400
    assert left(markers) == []


# ------------------------------------------------------------ the demo workload

@pytest.mark.slow
def test_the_demo_workload_imports_nothing_from_the_working_directory(child_env, tmp_path, markers, monkeypatch):
    from jaxtop.demo.app import Worker

    for key, value in child_env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(plant(tmp_path / "cwd", markers))
    worker = Worker(small=True)
    try:
        pid = worker.start()
        assert worker.proc.poll() is None and pid == worker.proc.pid
    finally:
        worker.close()
    assert left(markers) == []


# ------------------------------------------------------------ the stderr relay

RELAYED = """\
import os, sys
print("fd2", os.fstat(2).st_ino, flush=True)
sys.stderr.write("through the relay\\n")
sys.stderr.flush()
"""


@pytest.mark.slow
@pytest.mark.parametrize("how", ["jaxtop run", "jaxtop.instrument"])
def test_the_stderr_relay_imports_nothing_from_the_programs_working_directory(child_env, tmp_path, markers, how):
    """The relay is the program's child: it starts in the program's working
    directory. The program itself lives elsewhere (its own directory is on
    its sys.path, as with `python script.py`)."""
    code = tmp_path / "code"
    code.mkdir()
    script = code / "prog.py"
    if how == "jaxtop run":
        script.write_text(RELAYED)
        cmd = [PY, "-I", "-m", "jaxtop", "run", str(script)]
    else:
        script.write_text("import jaxtop\nhandle = jaxtop.instrument()\n" + RELAYED + "handle.stop()\n")
        cmd = [PY, str(script)]
    proc = subprocess.Popen(cmd, cwd=plant(tmp_path / "cwd", markers), env=child_env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    ours = os.fstat(proc.stderr.fileno()).st_ino
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert int(out.split()[1]) != ours  # fd 2 was the capture's pipe: the relay carried the line
    assert "through the relay" in err
    assert left(markers) == []


# ------------------------------------------------------------ gdb injection

@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux" or os.uname().machine != "x86_64", reason="gdb injection: Linux x86-64")
@pytest.mark.skipif(shutil.which("gdb") is None, reason="gdb is not installed")
def test_injecting_with_gdb_imports_nothing_from_the_working_directory(child_env, tmp_path, markers):
    """gdb's embedded Python honours the user's PYTHONPATH; a relative entry
    (`.`) names whatever directory gdb runs in."""
    clean = tmp_path / "clean"
    clean.mkdir()
    target = subprocess.Popen([PY, str(TARGETS / "plain_loop.py"), "--steps", "1500", "--sleep", "0.01"], cwd=clean,
                              env=child_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(2)  # jax imported, the loop running
        assert target.poll() is None
        log = clean / "injected.jsonl"
        res = jaxtop_isolated("log", target.pid, "--inject", "-o", log, "--duration", "2",
                              cwd=plant(tmp_path / "cwd", markers), env=dict(child_env, PYTHONPATH="."))
        assert res.returncode == 0, res.stderr
        records = [json.loads(line) for line in log.read_bytes().splitlines()]
        assert records[0]["type"] == "hello" and records[0]["pid"] == target.pid
        detach = jaxtop_isolated("detach", target.pid, cwd=clean, env=child_env)
        assert detach.returncode == 0, detach.stderr
    finally:
        target.kill()
        target.wait()
    assert left(markers) == []
