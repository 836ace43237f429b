"""Memory profiles (`s` in the dashboard, the agent's ``memory_profile``,
``jaxtop demo --headless``) go to jaxtop's own private state directory, not
into the program's working directory, and the reply names the file.

``$JAXTOP_PROFILE_DIR`` and an explicit absolute ``directory`` still win. The
directory jaxtop makes is mode 0700; one that is a planted symbolic link, or
that others may use, is refused rather than written through.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import time

import pytest

from conftest import PY, TARGETS
from jaxtop.agent.clients import CommandError
from jaxtop.agent.commands import profile_directory


def _command(sockdir, pid, name, args, timeout=60.0):
    """One command to the agent of ``pid``; its reply record."""
    s = socket.socket(socket.AF_UNIX)
    s.connect(str(sockdir / f"{pid}.sock"))
    s.settimeout(1.0)
    buf, sent, deadline = b"", False, time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            try:
                chunk = s.recv(1 << 16)
            except socket.timeout:
                chunk = b""
            buf += chunk
            lines = buf.split(b"\n")
            buf = lines.pop()
            for line in lines:
                rec = json.loads(line)
                if not sent and rec.get("type") == "sample" and rec.get("devices"):
                    # The backend exists: a profile can be taken.
                    s.sendall(json.dumps({"type": "command", "name": name, "args": args, "id": 1}).encode() + b"\n")
                    sent = True
                elif rec.get("type") == "reply" and rec.get("id") == 1:
                    return rec
        raise AssertionError("no reply")
    finally:
        s.close()


@pytest.fixture
def state_env(child_env, tmp_path):
    """A child environment whose XDG state directory is under ``tmp_path``,
    with no JAXTOP_PROFILE_DIR (the test session sets one), and a clean
    working directory."""
    env = dict(child_env, XDG_STATE_HOME=str(tmp_path / "state"))
    env.pop("JAXTOP_PROFILE_DIR", None)
    work = tmp_path / "work"
    work.mkdir()
    return env, work


@pytest.mark.slow
def test_a_profile_goes_to_jaxtops_state_directory_and_the_reply_names_it(state_env, sockdir, tmp_path):
    env, work = state_env
    proc = subprocess.Popen([PY, "-m", "jaxtop", "run", str(TARGETS / "loop.py"), "--seconds", "60"], env=env,
                            cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        sock = sockdir / f"{proc.pid}.sock"
        deadline = time.monotonic() + 60
        while not sock.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        reply = _command(sockdir, proc.pid, "memory_profile", {})
        assert reply["ok"], reply
        path = reply["result"]["path"]
        home = tmp_path / "state" / "jaxtop" / "profiles"
        assert os.path.dirname(path) == str(home) and os.path.isfile(path), path
        assert os.path.basename(path).startswith(f"jaxtop-memprof-{proc.pid}-")
        for folder in (home, home.parent):
            assert stat.S_IMODE(os.lstat(folder).st_mode) == 0o700, folder
        assert os.listdir(work) == []  # nothing in the program's working directory
        # An explicit absolute directory still wins (after the 2 s rate limit).
        explicit = tmp_path / "explicit"
        explicit.mkdir()
        time.sleep(2.1)
        reply = _command(sockdir, proc.pid, "memory_profile", {"directory": str(explicit)})
        assert reply["ok"] and os.path.dirname(reply["result"]["path"]) == str(explicit), reply
    finally:
        proc.kill()
        proc.communicate(timeout=30)


def test_jaxtop_profile_dir_still_wins(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("JAXTOP_PROFILE_DIR", str(tmp_path))
    assert profile_directory(None) == str(tmp_path)
    assert not (tmp_path / "state").exists()
    monkeypatch.delenv("JAXTOP_PROFILE_DIR")
    assert profile_directory(None) == str(tmp_path / "state" / "jaxtop" / "profiles")


def test_without_xdg_state_home_it_is_under_the_home_directory(monkeypatch, tmp_path):
    monkeypatch.delenv("JAXTOP_PROFILE_DIR", raising=False)
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert profile_directory(None) == str(tmp_path / ".local" / "state" / "jaxtop" / "profiles")
    # A relative XDG_STATE_HOME is ignored, as the XDG spec says.
    monkeypatch.setenv("XDG_STATE_HOME", "relative/state")
    assert profile_directory(None) == str(tmp_path / ".local" / "state" / "jaxtop" / "profiles")


@pytest.mark.parametrize("where", ["profiles", "jaxtop"])
def test_a_planted_link_or_a_shared_directory_is_refused_not_written_through(monkeypatch, tmp_path, where):
    monkeypatch.delenv("JAXTOP_PROFILE_DIR", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    victim = tmp_path / "victim"
    victim.mkdir(mode=0o700)
    (tmp_path / "state" / "jaxtop").mkdir(parents=True, mode=0o700)
    planted = tmp_path / "state" / "jaxtop" / ("profiles" if where == "profiles" else "")
    if where == "jaxtop":
        (tmp_path / "state" / "jaxtop").rmdir()
        planted = tmp_path / "state" / "jaxtop"
    planted.symlink_to(victim)
    with pytest.raises(CommandError, match="not a real directory"):
        profile_directory(None)
    assert os.listdir(victim) == []
    planted.unlink()
    # A directory others may write (made by hand, or by another tool): refused, not chmod'ed.
    planted.mkdir(mode=0o700)
    os.chmod(planted, 0o777)
    with pytest.raises(CommandError, match="mode 0777"):
        profile_directory(None)
    assert stat.S_IMODE(os.lstat(planted).st_mode) == 0o777


def test_headless_demo_profiles_go_to_the_state_directory(monkeypatch, tmp_path):
    from jaxtop.demo import headless

    monkeypatch.delenv("JAXTOP_PROFILE_DIR", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.chdir(tmp_path)
    assert headless._profile_dir(None) == str(tmp_path / "state" / "jaxtop" / "profiles")
    assert headless._profile_dir("/given") == "/given"
    monkeypatch.setenv("JAXTOP_PROFILE_DIR", str(tmp_path / "env"))
    assert headless._profile_dir(None) is None  # the runner reads $JAXTOP_PROFILE_DIR itself


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_headless_demo_run_leaves_no_profile_in_the_working_directory(state_env, tmp_path):
    env, work = state_env
    res = subprocess.run([PY, "-m", "jaxtop", "demo", "--headless", "--json", "--small", "--steps", "2"], env=env,
                         cwd=work, capture_output=True, timeout=380)
    rows = json.loads(res.stdout)["rows"]
    profile = [r for r in rows if r["strategy"] == "profiling"][0]
    path = profile["path"]
    assert os.path.dirname(path) == str(tmp_path / "state" / "jaxtop" / "profiles") and os.path.isfile(path), profile
    assert path in profile["note"]  # the table's row names the file
    assert not list(work.glob("*.prof")), os.listdir(work)
