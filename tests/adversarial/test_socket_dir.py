"""Adversarial: the socket directory and what listens in it.

Another user who pre-creates the socket directory (``/tmp/jaxtop-UID`` is a
name anyone can take first) or serves a socket in it must not be trusted by
the clients (``ls``, ``log``, ``attach``, ``detach``): no fake process
listed, no ``detach`` sent to a stranger. The agent must never chmod a
directory it did not create, and a hostile directory must give ``jaxtop
run`` and ``instrument()`` a one-line, documented failure.

Run as root, "another user" is real: directories are chowned to uid 65534
and the fake agent runs as that uid. The in-process checks that fake
``os.getuid`` or the ``SO_PEERCRED`` read run for any user.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import threading
from pathlib import Path

import pytest

from conftest import PY, wait_for
from jaxtop import cli
from jaxtop.wire import client, paths, protocol

NOBODY = 65534
SYSTEM_PY = "/usr/bin/python3"  # reachable by another user, unlike a venv under /root
as_root = pytest.mark.skipif(
    os.geteuid() != 0 or not os.path.exists(SYSTEM_PY), reason="needs root (chown, another uid) and a system python3"
)

# A fake agent, standard library only: serves a believable hello on
# DIR/PID.sock, answers `detach`, and notes in DIR/fake.log every connection
# and every line it receives.
FAKE_AGENT = r"""
import json, os, socket, sys, time
directory = sys.argv[1]
log = os.path.join(directory, "fake.log")
def note(text):
    with open(log, "a") as f:
        f.write(text + "\n")
path = os.path.join(directory, "%d.sock" % os.getpid())
srv = socket.socket(socket.AF_UNIX)
srv.bind(path)
os.chmod(path, 0o777)
srv.listen(8)
note("ready")
def send(conn, rec):
    conn.sendall((json.dumps(rec) + "\n").encode())
while True:
    conn, _ = srv.accept()
    note("connection")
    try:
        send(conn, {"type": "hello", "t": time.time(), "protocol": 1, "pid": os.getpid(),
                    "argv": ["evil-process"], "started_t": time.time()})
        conn.settimeout(2.0)
        pending = b""
        while True:
            chunk = conn.recv(65536)
            if not chunk:
                break
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                note("got " + line.decode(errors="replace"))
                rec = json.loads(line)
                if rec.get("name") == "detach":
                    send(conn, {"type": "reply", "t": time.time(), "id": rec.get("id"), "ok": True,
                                "result": {"detaching": True}})
    except (OSError, ValueError):
        pass
    conn.close()
"""


def jaxtop(*args, env, timeout=30, **kw):
    try:
        return subprocess.run([PY, "-m", "jaxtop", *map(str, args)], env=env, capture_output=True,
                              timeout=timeout, stdin=subprocess.DEVNULL, **kw)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"jaxtop {' '.join(map(str, args))} did not return within {timeout} s: it trusted the socket "
                    f"({(exc.stderr or b'')[-300:]!r})")


def start_fake_agent(directory: Path, uid: int | None = None) -> tuple[subprocess.Popen, Path]:
    kw = {"user": uid, "group": uid, "extra_groups": []} if uid is not None else {}
    python = SYSTEM_PY if uid is not None else PY
    proc = subprocess.Popen([python, "-c", FAKE_AGENT, str(directory)], cwd="/", stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, **kw)
    log = directory / "fake.log"
    wait_for(lambda: (log.exists() and "ready" in log.read_text()) or proc.poll() is not None, timeout=15,
             what="the fake agent")
    assert proc.poll() is None, proc.stderr.read()
    return proc, log


def stop(proc: subprocess.Popen) -> None:
    proc.kill()
    proc.wait(timeout=10)


def one_line(stderr: bytes) -> str:
    text = stderr.decode()
    assert "Traceback" not in text, text
    assert len(text.strip().splitlines()) == 1, text
    return text.strip()


@pytest.fixture
def hostile_dir():
    """A socket directory someone else created first: owned by uid 65534, 0700."""
    path = Path(tempfile.mkdtemp(prefix="jt-evil-", dir="/tmp"))
    os.chown(path, NOBODY, NOBODY)
    yield path
    shutil.rmtree(path, ignore_errors=True)


# -- the agent never chmods a directory it did not create -----------------------


@pytest.mark.parametrize("mode", [0o755, 0o1777], ids=["project-dir", "shared-like-tmp"])
def test_existing_directory_with_group_or_other_access_is_refused_and_not_chmodded(tmp_path, monkeypatch, mode):
    # A stand-in for a project directory, or for /tmp itself (never /tmp: an
    # old jaxtop would chmod it).
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, mode)
    monkeypatch.setenv("JAXTOP_SOCKET_DIR", str(shared))
    with pytest.raises(paths.SocketDirError, match=str(shared)):
        paths.ensure_socket_dir()
    assert stat.S_IMODE(os.lstat(shared).st_mode) == mode
    # A directory jaxtop creates itself is made private, whatever the umask,
    # and accepted from then on.
    fresh = shared / "a" / "sock"
    monkeypatch.setenv("JAXTOP_SOCKET_DIR", str(fresh))
    old = os.umask(0)
    try:
        assert paths.ensure_socket_dir() == fresh
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.lstat(fresh).st_mode) == 0o700
    assert paths.ensure_socket_dir() == fresh
    assert stat.S_IMODE(os.lstat(shared).st_mode) == mode


# -- clients: the directory's owner and mode ------------------------------------


@as_root
def test_clients_refuse_a_directory_owned_by_another_user(hostile_dir, child_env):
    fake, log = start_fake_agent(hostile_dir, uid=NOBODY)
    env = dict(child_env, JAXTOP_SOCKET_DIR=str(hostile_dir))
    try:
        for args in (["ls"], ["ls", "--json"], ["log", fake.pid, "--duration", "1"], ["detach", fake.pid],
                     ["attach", fake.pid]):
            res = jaxtop(*args, env=env)
            assert res.returncode == 2, (args, res.stdout, res.stderr)
            line = one_line(res.stderr)
            assert str(hostile_dir) in line and "65534" in line, line
            assert b"evil-process" not in res.stdout
        # Refused before connecting: the fake agent never heard from us.
        assert log.read_text().split() == ["ready"]
    finally:
        stop(fake)


def test_clients_refuse_a_directory_owned_by_another_uid_faked(sockdir, monkeypatch, capsys):
    listener = Listener(sockdir)
    monkeypatch.setattr(signal, "signal", lambda *args: None)  # `log` must not keep handlers in pytest
    real = os.getuid()
    monkeypatch.setattr(os, "getuid", lambda: real + 1000)
    with pytest.raises(paths.SocketDirError, match=f"{sockdir}.*uid {real}"):
        client.list_agents()
    with pytest.raises(paths.SocketDirError, match=str(sockdir)):
        client.AgentConnection.open(os.getpid())
    for args in (["ls"], ["detach", str(os.getpid())], ["log", str(os.getpid()), "--duration", "1"]):
        assert cli.main(args) == 2, args
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and str(sockdir) in err and f"uid {real}" in err, err
    assert listener.connections == 0


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o1733])
def test_clients_refuse_a_directory_others_can_write(sockdir, mode):
    listener = Listener(sockdir)
    os.chmod(sockdir, mode)
    with pytest.raises(paths.SocketDirError, match=str(sockdir)):
        client.list_agents()
    with pytest.raises(paths.SocketDirError, match=str(sockdir)):
        client.AgentConnection.open(os.getpid())
    assert listener.connections == 0
    assert stat.S_IMODE(os.lstat(sockdir).st_mode) == mode


def test_clients_refuse_a_symlinked_socket_directory(tmp_path, monkeypatch):
    real = Path(tempfile.mkdtemp(prefix="jt-real-"))
    try:
        link = tmp_path / "link"
        link.symlink_to(real)
        monkeypatch.setenv("JAXTOP_SOCKET_DIR", str(link))
        Listener(real)
        with pytest.raises(paths.SocketDirError, match="symbolic link"):
            client.list_agents()
    finally:
        shutil.rmtree(real, ignore_errors=True)


# -- clients: the agent's peer uid (SO_PEERCRED) ---------------------------------


@as_root
def test_clients_refuse_a_socket_served_by_another_user(sockdir, child_env):
    # The fake agent binds in an open directory of its own; root links the
    # socket into our private directory under the fake's pid. The directory
    # is fine, so only the peer check can tell.
    open_dir = Path(tempfile.mkdtemp(prefix="jt-open-", dir="/tmp"))
    os.chmod(open_dir, 0o777)
    fake, log = start_fake_agent(open_dir, uid=NOBODY)
    try:
        os.link(open_dir / f"{fake.pid}.sock", sockdir / f"{fake.pid}.sock")
        for args in (["log", fake.pid, "--duration", "1"], ["detach", fake.pid], ["attach", fake.pid]):
            res = jaxtop(*args, env=child_env)
            assert res.returncode == 2, (args, res.stdout, res.stderr)
            line = one_line(res.stderr)
            assert f"{fake.pid}.sock" in line and "65534" in line, line
            assert b"evil-process" not in res.stdout
        res = jaxtop("ls", env=child_env)
        assert b"evil-process" not in res.stdout
        assert b"65534" in res.stderr, res.stderr
        # It was connected to (that is how its uid is learned), never sent a command.
        assert "got" not in log.read_text()
    finally:
        stop(fake)
        shutil.rmtree(open_dir, ignore_errors=True)


def test_clients_refuse_a_peer_of_another_uid_faked(sockdir, monkeypatch):
    listener = Listener(sockdir)
    monkeypatch.setattr(client, "peer_credentials", lambda sock: (4321, os.getuid() + 1000, 0))
    with pytest.raises(paths.SocketDirError, match=rf"{os.getpid()}\.sock.*uid {os.getuid() + 1000}"):
        client.AgentConnection.open(os.getpid())
    refused: list[str] = []
    assert client.list_agents(on_refused=refused.append) == []
    assert len(refused) == 1 and f"uid {os.getuid() + 1000}" in refused[0]
    listener.close()
    assert listener.received == b""  # nothing was ever sent to it


def test_peer_credentials_reads_the_real_peer():
    ours, theirs = socket.socketpair()
    with ours, theirs:
        assert client.peer_credentials(ours) == (os.getpid(), os.getuid(), os.getgid())


# -- a hostile directory: `jaxtop run` and instrument() ---------------------------


def _make_hostile(kind: str, tmp_path: Path) -> Path:
    if kind == "symlink":
        target = tmp_path / "elsewhere"
        target.mkdir(mode=0o700)
        path = tmp_path / "link"
        path.symlink_to(target)
    elif kind == "file":
        path = tmp_path / "afile"
        path.write_text("not a directory")
    elif kind == "mode-0777":
        path = tmp_path / "open"
        path.mkdir()
        os.chmod(path, 0o777)
    else:
        path = tmp_path / "theirs"
        path.mkdir(mode=0o700)
        os.chown(path, NOBODY, NOBODY)
    return path


KINDS = ["symlink", "file", "mode-0777",
         pytest.param("other-uid", marks=pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root"))]


@pytest.mark.parametrize("kind", KINDS)
def test_run_with_a_hostile_socket_dir_prints_one_line_and_exits_2(kind, tmp_path, child_env):
    path = _make_hostile(kind, tmp_path)
    before = os.lstat(path)
    script = tmp_path / "prog.py"
    script.write_text("print('the program ran')\n")
    res = jaxtop("run", script, env=dict(child_env, JAXTOP_SOCKET_DIR=str(path)))
    assert res.returncode == 2, (res.stdout, res.stderr)
    line = one_line(res.stderr)
    assert line.startswith("jaxtop run:") and str(path) in line, line
    assert b"the program ran" not in res.stdout
    after = os.lstat(path)
    assert (after.st_mode, after.st_uid) == (before.st_mode, before.st_uid)  # nothing chmodded or chowned


@pytest.mark.parametrize("kind", KINDS)
def test_instrument_raises_the_documented_socket_dir_error(kind, tmp_path, child_env):
    path = _make_hostile(kind, tmp_path)
    code = (
        "import jaxtop\nfrom jaxtop.wire import paths\n"
        "try:\n    jaxtop.instrument(capture_stderr=False, nvml=False)\n"
        "except OSError as exc:\n    print('raised', type(exc).__name__, isinstance(exc, paths.SocketDirError))\n"
        "else:\n    print('started')\n"
    )
    res = subprocess.run([PY, "-c", code], env=dict(child_env, JAXTOP_SOCKET_DIR=str(path)), capture_output=True,
                         timeout=60)
    assert res.stdout.decode().split() == ["raised", "SocketDirError", "True"], (res.stdout, res.stderr)
    import jaxtop

    doc = jaxtop.instrument.__doc__ or ""
    assert "SocketDirError" in doc and issubclass(paths.SocketDirError, OSError)


# -- helpers -----------------------------------------------------------------------


class Listener:
    """A fake agent in this process at ``DIR/<our pid>.sock``: counts
    connections, sends a hello, keeps what it receives."""

    def __init__(self, directory: Path) -> None:
        self.server = socket.socket(socket.AF_UNIX)
        self.server.bind(str(Path(directory) / f"{os.getpid()}.sock"))
        self.server.listen(4)
        self.connections = 0
        self.received = b""
        self._stop = False
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            self.connections += 1
            with conn:
                try:
                    conn.sendall(protocol.encode({"type": "hello", "t": 1.0, "argv": ["evil-process"]}))
                    conn.settimeout(0.5)
                    while chunk := conn.recv(4096):
                        self.received += chunk
                except OSError:
                    pass

    def close(self) -> None:
        self._stop = True
        try:
            self.server.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.server.close()

