"""Adversarial: symbolic links planted where jaxtop writes.

A project directory that a group shares (setgid, mode 2770) is not sticky,
so Linux's ``fs.protected_symlinks`` does not protect it: any member may put
a link at a name jaxtop is about to write (``PATH.tmp``, the OOM census's
``jaxtop-oom-PID-TIME.json``, the profile's ``jaxtop-memprof-PID-TIME.prof``,
``-o out.csv``) pointing at a file only the victim may write, and jaxtop,
running as the victim, used to write the census into it.

The first half tests the one helper every writer goes through
(:mod:`jaxtop.wire.paths`): temporary names are random, made with
``O_EXCL|O_NOFOLLOW``, removed on any failure, a full disk says so and
leaves nothing. The second half creates two users that share a group, has
the attacker plant links at every name the writers would use, runs each
writer as the victim and checks that the victim's private file is byte for
byte what it was.
"""

from __future__ import annotations

import errno
import grp
import json
import os
import pwd
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import pytest

from jaxtop.wire import paths

PY = sys.executable
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
NOBODY = 65534  # a uid that is not ours: stands for "someone else" where no second user is needed
TEMP_NAME = re.compile(r"\.out\.json\.[0-9a-f]{16}\.tmp")


def names_in(folder: Path) -> list[str]:
    return sorted(os.listdir(folder))


# ------------------------------------------------------------ the helper itself

def test_temporary_names_are_random_and_beside_the_file(tmp_path):
    seen = set()
    for _ in range(50):
        with paths.replacing(tmp_path / "out.json") as f:
            f.write(b"{}")
            temps = [n for n in names_in(tmp_path) if n != "out.json"]
            assert len(temps) == 1 and TEMP_NAME.fullmatch(temps[0]), temps
            seen.add(temps[0])
    assert len(seen) == 50  # 64 random bits each: never the predictable PATH.tmp
    assert names_in(tmp_path) == ["out.json"]


def test_a_link_at_the_temporary_name_is_never_followed(tmp_path, monkeypatch):
    """The temporary file is made with O_EXCL|O_NOFOLLOW: a link already at
    its name (dangling or not) makes the open fail and another name is
    drawn; neither the link's target nor a file it names gets written."""
    victim = tmp_path / "victim"
    victim.write_bytes(b"private\n")
    draws = iter([b"\x11" * 8, b"\x22" * 8, b"\x33" * 8])
    monkeypatch.setattr(os, "urandom", lambda n: next(draws))
    (tmp_path / f".out.json.{'11' * 8}.tmp").symlink_to(victim)
    (tmp_path / f".out.json.{'22' * 8}.tmp").symlink_to(tmp_path / "would-be-created")
    paths.write_atomic(tmp_path / "out.json", b"census\n")
    assert (tmp_path / "out.json").read_bytes() == b"census\n"
    assert victim.read_bytes() == b"private\n"
    assert not (tmp_path / "would-be-created").exists()


def test_the_file_is_not_inherited_by_children(tmp_path):
    with paths.replacing(tmp_path / "out.json") as f:
        assert os.get_inheritable(f.fileno()) is False
        assert fcntl_cloexec(f.fileno())
    f = paths.create_output(tmp_path / "log.jsonl")
    try:
        assert fcntl_cloexec(f.fileno())
    finally:
        f.close()


def fcntl_cloexec(fd: int) -> bool:
    import fcntl

    return bool(fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC)


def test_a_failure_while_writing_leaves_the_old_file_and_no_temporary_one(tmp_path):
    (tmp_path / "out.json").write_bytes(b"old\n")
    with pytest.raises(RuntimeError):
        with paths.replacing(tmp_path / "out.json") as f:
            f.write(b"half of the new")
            raise RuntimeError("the writer failed")
    with pytest.raises(KeyboardInterrupt):
        with paths.replacing(tmp_path / "out.json", "w") as f:
            f.write("half")
            raise KeyboardInterrupt
    assert names_in(tmp_path) == ["out.json"] and (tmp_path / "out.json").read_bytes() == b"old\n"


def test_a_file_size_limit_is_a_clear_error_and_leaves_nothing(tmp_path):
    """RLIMIT_FSIZE makes the kernel refuse the write (EFBIG), in a child
    so that the limit stays there."""
    code = textwrap.dedent(f"""
        import errno, resource, signal, sys
        sys.path[:] = {[p for p in sys.path if os.path.isabs(p)]!r}
        from jaxtop.wire import paths
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
        try:
            paths.write_atomic({str(tmp_path / "out.json")!r}, b"x" * 100_000)
        except OSError as exc:
            print(exc.errno == errno.EFBIG, exc.filename, exc.strerror)
    """)
    (tmp_path / "out.json").write_bytes(b"old\n")
    res = subprocess.run([PY, "-I", "-c", code], capture_output=True, text=True, timeout=60)
    assert res.stdout.split(" ", 2)[:2] == ["True", str(tmp_path / "out.json")], res.stdout + res.stderr
    assert names_in(tmp_path) == ["out.json"] and (tmp_path / "out.json").read_bytes() == b"old\n"


@pytest.mark.skipif(not IS_ROOT, reason="mounting a small tmpfs needs root")
def test_a_full_disk_is_a_clear_error_and_leaves_no_partial_file(tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        (mnt / "kept.json").write_bytes(b"old\n")
        for name in ("kept.json", "new.json"):
            with pytest.raises(OSError) as err:
                paths.write_atomic(mnt / name, b"x" * 1_000_000)
            assert err.value.errno == errno.ENOSPC and err.value.filename == str(mnt / name)
            assert str(mnt / name) in str(err.value) and "\n" not in str(err.value)
            # A writer of its own (an export): the error is the write's, the file as it was.
            with pytest.raises(OSError) as err:
                with paths.replacing(mnt / name, "w", encoding="utf-8") as f:
                    f.write("y" * 1_000_000)
            assert err.value.errno == errno.ENOSPC
        assert names_in(mnt) == ["kept.json"] and (mnt / "kept.json").read_bytes() == b"old\n"
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_own_links_are_followed_and_kept(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "real.json").write_bytes(b"old\n")
    os.chmod(tmp_path / "data" / "real.json", 0o640)
    (tmp_path / "out.json").symlink_to("data/real.json")
    paths.write_atomic(tmp_path / "out.json", b"new\n")
    assert os.readlink(tmp_path / "out.json") == "data/real.json"
    assert (tmp_path / "data" / "real.json").read_bytes() == b"new\n"
    assert stat.S_IMODE((tmp_path / "data" / "real.json").stat().st_mode) == 0o640


@pytest.mark.skipif(not IS_ROOT, reason="a link owned by another uid needs lchown (root)")
@pytest.mark.parametrize("writer", ["write_atomic", "replacing", "create_output"])
def test_someone_elses_link_at_the_name_is_replaced_not_followed(tmp_path, writer):
    victim = tmp_path / "victim"
    victim.write_bytes(b"private\n")
    os.chmod(victim, 0o600)
    link = tmp_path / "out.json"
    link.symlink_to(victim)
    os.lchown(link, NOBODY, NOBODY)
    if writer == "write_atomic":
        paths.write_atomic(link, b"new\n")
    elif writer == "replacing":
        with paths.replacing(link, "w") as f:
            f.write("new\n")
    else:
        f = paths.create_output(link)
        assert stat.S_ISREG(os.lstat(link).st_mode)  # in place at once: readers see it grow
        f.write(b"new\n")
        f.close()
    assert victim.read_bytes() == b"private\n"
    assert stat.S_ISREG(os.lstat(link).st_mode) and link.read_bytes() == b"new\n"
    assert names_in(tmp_path) == ["out.json", "victim"]


@pytest.mark.skipif(not IS_ROOT, reason="a FIFO owned by another uid needs chown (root)")
def test_someone_elses_fifo_at_the_name_is_replaced_not_opened(tmp_path):
    """Opening a FIFO for writing blocks until someone reads it (a census
    writer stuck in the user's program) and hands them the data."""
    fifo = tmp_path / "out.json"
    os.mkfifo(fifo)
    os.chown(fifo, NOBODY, NOBODY)
    done = threading.Event()

    def write() -> None:
        paths.write_atomic(fifo, b"census\n")
        done.set()

    threading.Thread(target=write, daemon=True).start()
    if not done.wait(10):
        os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))  # unblock the writer before failing
        pytest.fail("write_atomic opened someone else's FIFO")
    assert stat.S_ISREG(os.lstat(fifo).st_mode) and fifo.read_bytes() == b"census\n"


def test_a_directory_at_the_name_is_a_clear_error(tmp_path):
    (tmp_path / "out.json").mkdir()
    with pytest.raises(IsADirectoryError) as err:
        paths.write_atomic(tmp_path / "out.json", b"x")
    assert err.value.filename == str(tmp_path / "out.json")
    assert names_in(tmp_path) == ["out.json"]


def test_a_link_loop_is_a_clear_error(tmp_path):
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    with pytest.raises(OSError) as err:
        paths.write_atomic(tmp_path / "a", b"x")
    assert err.value.errno == errno.ELOOP and err.value.filename == str(tmp_path / "a")


# ------------------------------------------------------------ two users, one shared directory

# Runs as root until it has imported what it needs and written once into a
# private scratch directory (the interpreter may live where only root can
# read, under /root), then becomes the victim: the writes that count are the
# victim's own, with the victim's uid and groups.
VICTIM = r'''
import json, os, sys, time
plan = json.loads(sys.argv[1])
sys.path[:] = plan["sys_path"]
import jax, jax.numpy as jnp
from jaxtop import budgets, cli
from jaxtop.agent.log import RecordLog
from jaxtop.cli.log import _log_output
from jaxtop.dashboard.sources import ReplaySource
from jaxtop.probes.memory_profile import take_profile
from jaxtop.probes.oom.write import write_census

kept = jnp.arange(1000.0).block_until_ready()  # something for the profile to hold


def writers(where, rec):
    def profile():
        result = take_profile(where, keep=None)
        if "error" in result:
            raise OSError(result["error"])
        return result["path"]

    def export(*out):
        rc = cli.main(["export", rec, "--format", "csv", *out])
        if rc:
            raise OSError(f"jaxtop export exited {rc}")
        return out[1] if out else os.path.splitext(rec)[0] + ".csv"

    def budget(path):
        budgets.write_json(budgets.check(budgets.parse_spec("h2d=0"), {}), path)
        return path

    def log(path):
        failures = []
        record_log = RecordLog(path, failures.append)
        record_log.write(b'{"type":"hello","t":1.0}\n', urgent=True)
        record_log.close()
        if failures:
            raise OSError(failures[0])
        return path

    def cli_log(path):
        out = _log_output(path)
        out.write(b'{"type":"hello","t":1.0}\n')
        out.close()
        return path

    def session(path):
        source = ReplaySource(rec, start_playing=False)
        try:
            return source.save(path)[0]
        finally:
            source.stop()

    census = {"type": "oom_census", "pid": plan["census_pid"], "t": plan["census_t"]}
    return {
        "census": lambda: write_census(census, directory=where),
        "memory_profile": profile,
        "export": lambda: export("-o", os.path.join(where, "out.csv")),
        "export_default": lambda: export(),
        "budget_report": lambda: budget(os.path.join(where, "budget.json")),
        "log": lambda: log(os.path.join(where, "run.jsonl")),
        "cli_log": lambda: cli_log(os.path.join(where, "log.jsonl")),
        "session": lambda: session(os.path.join(where, plan["session_name"])),
    }


def run_all(where, rec):
    results = {}
    for name, write in writers(where, rec).items():
        try:
            results[name] = {"ok": write()}
        except Exception as exc:
            results[name] = {"error": f"{type(exc).__name__}: {exc}"}
    return results


warm = run_all(plan["scratch"], plan["scratch_rec"])  # every lazy import done while still root
assert all("ok" in r for r in warm.values()), warm
os.setgroups([plan["share_gid"]])
os.setgid(plan["gid"])
os.setuid(plan["uid"])
print(json.dumps({"pid": os.getpid(), "t": time.time()}), flush=True)
sys.stdin.readline()  # the attacker plants its links meanwhile
print(json.dumps(run_all(plan["shared"], plan["rec"])), flush=True)
'''

WRITERS = ["census", "memory_profile", "export", "export_default", "budget_report", "log", "cli_log", "session"]


def recording_bytes() -> bytes:
    from jaxtop.testing import synthetic
    from jaxtop.wire import protocol

    lines = [protocol.encode(synthetic.hello(7, 1, 1000.0))]
    lines += [protocol.encode(rec) for rec in synthetic.samples(7, 1, 1000.0, 20)]
    return b"".join(lines)


def _run(*cmd: str) -> None:
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode:
        pytest.fail(f"{' '.join(cmd)} failed: {res.stderr.strip()}")


@pytest.fixture(scope="module")
def two_users():
    """A group and two users in it, removed afterwards: (victim, attacker, group) as pwd/grp entries."""
    if not sys.platform.startswith("linux"):
        pytest.skip("the shared-directory scenario is Linux's (setgid directories, fs.protected_symlinks)")
    if not IS_ROOT:
        pytest.skip("creating a second and a third user needs root (useradd)")
    if not (shutil.which("useradd") and shutil.which("groupadd")):
        pytest.skip("useradd/groupadd are not installed")
    tag = f"{os.getpid() % 100000}"
    group, victim, attacker = f"jxshare{tag}", f"jxvictim{tag}", f"jxattack{tag}"
    _run("groupadd", group)
    made = []
    try:
        for user in (victim, attacker):
            _run("useradd", "-M", "-N", "-g", group, "-s", "/bin/sh", user)
            made.append(user)
        # Each user's own primary group would be usual; here both have the
        # shared one as primary, and the victim's files are still mode 600.
        yield pwd.getpwnam(victim), pwd.getpwnam(attacker), grp.getgrnam(group)
    finally:
        for user in made:
            subprocess.run(["userdel", user], capture_output=True)
        subprocess.run(["groupdel", group], capture_output=True)


def _plant(attacker: pwd.struct_passwd, group: grp.struct_group, links: dict[Path, Path]) -> None:
    """The attacker, as itself, makes each link (name -> target)."""
    script = "".join(f"ln -s '{target}' '{name}' || exit 1\n" for name, target in links.items())
    res = subprocess.run(["sh", "-c", script], user=attacker.pw_uid, group=group.gr_gid,
                         extra_groups=[group.gr_gid], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    for name in links:
        assert os.lstat(name).st_uid == attacker.pw_uid


@pytest.fixture(scope="module")
def attack(two_users, tmp_path_factory):
    """Every writer run as the victim in a shared directory full of the
    attacker's links; returns what each writer did and the scene."""
    victim, attacker, group = two_users
    base = Path(tempfile.mkdtemp(prefix="jaxtop-planted-"))  # not under pytest's 0700 tree: both users enter
    os.chmod(base, 0o711)
    try:
        shared = base / "shared"
        shared.mkdir()
        os.chown(shared, 0, group.gr_gid)
        os.chmod(shared, 0o2770)  # setgid, group-writable, not sticky: protected_symlinks does not apply
        home = base / "victim"
        home.mkdir()
        os.chown(home, victim.pw_uid, group.gr_gid)
        os.chmod(home, 0o700)
        secrets = {}
        for name in WRITERS:
            secret = home / f"{name}.secret"
            secret.write_bytes(f"{name}: only the victim may write this\n".encode() + os.urandom(32))
            os.chown(secret, victim.pw_uid, group.gr_gid)
            os.chmod(secret, 0o600)
            secrets[name] = (secret, secret.read_bytes(), os.stat(secret))
        rec = shared / "rec.jsonl"
        rec.write_bytes(recording_bytes())
        os.chmod(rec, 0o644)
        scratch = tmp_path_factory.mktemp("root-scratch")
        (scratch / "rec.jsonl").write_bytes(recording_bytes())
        census_pid, census_t = 4242, time.time()
        session_name = f"jaxtop-7-{time.strftime('%Y%m%d-%H%M%S')}.jsonl"
        plan = {
            "sys_path": [p for p in sys.path if os.path.isabs(p)], "uid": victim.pw_uid, "gid": group.gr_gid,
            "share_gid": group.gr_gid, "shared": str(shared), "rec": str(rec), "scratch": str(scratch),
            "scratch_rec": str(scratch / "rec.jsonl"), "census_pid": census_pid, "census_t": census_t,
            "session_name": session_name,
        }
        env = dict(os.environ, JAX_PLATFORMS="cpu", JAXTOP_SOCKET_DIR=str(scratch / "sock"))
        proc = subprocess.Popen([PY, "-I", "-c", VICTIM, json.dumps(plan)], cwd=shared, env=env,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            first = proc.stdout.readline()
            if not first:
                pytest.fail("the victim process did not start: " + proc.communicate(timeout=60)[1][-3000:])
            started = json.loads(first)
            links: dict[Path, Path] = {}
            # The census's name is known in advance: PID and time are the census's own.
            stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(census_t))
            census = shared / f"jaxtop-oom-{census_pid}-{stamp}"
            links[Path(f"{census}.json")] = secrets["census"][0]  # the final name: taken, so -1 is used
            for n in ("", "-1", "-2", "-3"):
                links[Path(f"{census}{n}.json.tmp")] = secrets["census"][0]
            # The profile's: the victim's pid and any second of the next minute and a half.
            for t in range(int(started["t"]) - 1, int(started["t"]) + 90):
                base_name = shared / f"jaxtop-memprof-{started['pid']}-{time.strftime('%Y%m%d-%H%M%S', time.localtime(t))}"
                links[Path(f"{base_name}.prof")] = secrets["memory_profile"][0]
                for n in ("", "-1", "-2"):
                    links[Path(f"{base_name}{n}.prof.tmp")] = secrets["memory_profile"][0]
            # The names the user gives or the commands pick, and their old temporary names.
            for name, file in [("export", "out.csv"), ("export_default", "rec.csv"), ("budget_report", "budget.json"),
                               ("log", "run.jsonl"), ("cli_log", "log.jsonl"), ("session", session_name)]:
                links[shared / file] = secrets[name][0]
                links[shared / f"{file}.tmp"] = secrets[name][0]
            _plant(attacker, group, links)
            out, err = proc.communicate("go\n", timeout=240)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == 0, err[-3000:]
        results = json.loads(out.strip().splitlines()[-1])
        yield {"results": results, "secrets": secrets, "shared": shared, "links": links, "victim": victim, "err": err}
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.parametrize("writer", WRITERS)
def test_a_planted_link_never_writes_into_the_victims_file(attack, writer):
    secret, content, before = attack["secrets"][writer]
    after = os.stat(secret)
    assert secret.read_bytes() == content, f"{writer} wrote into the victim's private file through a planted link"
    assert (after.st_ino, after.st_mode, after.st_uid) == (before.st_ino, before.st_mode, before.st_uid)
    result = attack["results"][writer]
    assert "ok" in result, f"{writer} failed: {result.get('error')}\n{attack['err'][-2000:]}"
    written = os.lstat(result["ok"])
    assert stat.S_ISREG(written.st_mode) and written.st_uid == attack["victim"].pw_uid, result


@pytest.mark.slow
def test_the_shared_directory_holds_only_the_outputs_and_the_links(attack):
    """No temporary file is left behind, and the attacker's links that were
    not at a final name are where they were, untouched."""
    shared = attack["shared"]
    outputs = {os.path.basename(r["ok"]) for r in attack["results"].values() if "ok" in r}
    for name in os.listdir(shared):
        st = os.lstat(shared / name)
        if stat.S_ISLNK(st.st_mode):
            assert shared / name in attack["links"] and name not in outputs
        else:
            assert name in outputs | {"rec.jsonl"}, f"left behind: {name}"
