"""Real layer: JAX child processes under `jaxtop run`, talking over real sockets."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from conftest import PY, TARGETS, jaxtop_cmd, wait_for
from jaxtop.wire import protocol

pytestmark = pytest.mark.slow

GUARD = re.compile(rb"(host-to-device|device-to-device|device-to-host) transfer:")


def read_log(path):
    with open(path, "rb") as f:
        return list(protocol.iter_records(f))


def last_sample(records):
    samples = [r for r in records if r["type"] == "sample"]
    assert samples, records[:3]
    return samples[-1]


def count_guard_lines(stderr: bytes) -> dict[str, int]:
    counts = {"h2d": 0, "d2d": 0, "d2h": 0}
    names = {b"host-to-device": "h2d", b"device-to-device": "d2d", b"device-to-host": "d2h"}
    for line in stderr.splitlines():
        m = GUARD.search(line)
        if m:
            counts[names[m.group(1)]] += 1
    return counts


def test_transfer_counts_exact_and_stderr_untouched(child_env, tmp_path):
    """Acceptance 2: totals in the last sample == lines of a plain guarded run;
    the program's own stderr arrives byte-identical and in order."""
    script = TARGETS / "mix.py"
    env_log = dict(child_env, JAX_TRANSFER_GUARD="log")
    plain_logged = subprocess.run([PY, str(script)], env=env_log, capture_output=True, timeout=120)
    assert plain_logged.returncode == 0, plain_logged.stderr[-2000:]
    expected = count_guard_lines(plain_logged.stderr)
    assert expected["h2d"] > 40 and expected["d2d"] >= 1, expected

    plain = subprocess.run([PY, str(script)], env=child_env, capture_output=True, timeout=120)
    log = tmp_path / "run.jsonl"
    run = jaxtop_cmd("run", "--log", log, script, env=child_env, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stderr == plain.stderr  # byte-identical, guard lines hidden
    assert run.stdout == plain.stdout

    records = read_log(log)
    assert records[0]["type"] == "hello"
    final = last_sample(records)
    assert final.get("final") is True
    assert records[-1]["type"] == "exit"
    t = final["transfers"]
    assert t["h2d"]["count_total"] == expected["h2d"]
    assert t["d2d"]["count_total"] == expected["d2d"]
    assert t["d2h"]["count_total"] == expected["d2h"] == 0
    assert t["h2d"]["bytes_known_total"] >= 2 * 64 * 32 * 4  # first call logs avals
    # seq is contiguous and time moves forward
    seqs = [r["seq"] for r in records if r["type"] == "sample"]
    assert seqs == list(range(1, len(seqs) + 1))
    # The agent's own cost, as it records it: the whole thread covers the
    # sampling and more, and neither runs backwards.
    costs = [(r["agent"]["cpu_s_total"], r["agent"]["thread_cpu_s_total"]) for r in records
             if r["type"] == "sample" and "agent" in r]  # once a second, and the first and final ones
    assert len(costs) >= 2 and "agent" in final
    assert all(0 < tick <= thread for tick, thread in costs)
    assert all(a[0] <= b[0] and a[1] <= b[1] for a, b in zip(costs, costs[1:]))
    devices = final["devices"]
    assert [d["id"] for d in devices] == [0, 1]
    assert all(d["source"] == "live_arrays" and d["fragmentation"] is None for d in devices)


def test_user_guard_log_still_reaches_user(child_env, tmp_path):
    """If the user set the guard to log themselves, they still see their lines."""
    script = TARGETS / "mix.py"
    env_log = dict(child_env, JAX_TRANSFER_GUARD="log")
    plain = subprocess.run([PY, str(script)], env=env_log, capture_output=True, timeout=120)
    log = tmp_path / "run.jsonl"
    run = jaxtop_cmd("run", "--log", log, script, env=env_log, timeout=120)
    assert run.returncode == 0
    expected = count_guard_lines(plain.stderr)
    assert count_guard_lines(run.stderr) == expected
    final = last_sample(read_log(log))
    assert final["transfers"]["h2d"]["count_total"] == expected["h2d"]
    hello = read_log(log)[0]
    assert hello["type"] == "hello"


def test_exit_code_and_final_sample_on_os_exit_and_errors(child_env, tmp_path):
    script = TARGETS / "mix.py"
    # os._exit skips atexit: no final sample, but stderr is not lost and the code stays.
    env = dict(child_env, MIX_EXIT="3", MIX_N="2")
    plain = subprocess.run([PY, str(script)], env=env, capture_output=True, timeout=120)
    run = jaxtop_cmd("run", script, env=env, timeout=120)
    assert run.returncode == plain.returncode == 3
    assert run.stderr == plain.stderr
    assert run.stderr.endswith(b"user line at the end\n")

    raises = TARGETS / "raises.py"
    for mode, code in (("raise", 1), ("exit", 7)):
        plain = subprocess.run([PY, str(raises), mode], env=child_env, capture_output=True, timeout=120)
        log = tmp_path / f"{mode}.jsonl"
        run = jaxtop_cmd("run", "--log", log, raises, mode, env=child_env, timeout=120)
        assert run.returncode == plain.returncode == code
        assert run.stdout == plain.stdout  # same sys.argv and __name__
        assert run.stderr == plain.stderr  # the same traceback, no jaxtop frames
        records = read_log(log)
        assert last_sample(records).get("final") is True


def test_run_module_same_argv_as_python_m(child_env):
    env = dict(child_env)
    env["PYTHONPATH"] = str(TARGETS) + os.pathsep + env.get("PYTHONPATH", "")
    plain = subprocess.run([PY, "-m", "raises", "ok", "--log", "x"], env=env, capture_output=True, timeout=120)
    run = jaxtop_cmd("run", "-m", "raises", "ok", "--log", "x", env=env)
    assert plain.returncode == run.returncode == 0
    assert run.stdout == plain.stdout
    assert b"'--log', 'x'" in run.stdout


def test_ls_log_backfill_and_stale_sockets(targets, child_env, sockdir, tmp_path):
    proc = targets.run(TARGETS / "loop.py", "--seconds", "60")
    targets.wait_ready(proc)  # jax imported: samples carry devices from here on
    # A stale socket left by a dead process is removed quietly.
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = sockdir / f"{dead.pid}.sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(stale))
    s.close()
    ls = jaxtop_cmd("ls", env=child_env)
    assert ls.returncode == 0
    out = ls.stdout.decode()
    assert str(proc.pid) in out and "loop.py" in out
    assert not stale.exists()

    # Two recorders at once see the same seq values; a late one gets the backfill.
    a = subprocess.Popen([PY, "-m", "jaxtop", "log", str(proc.pid), "-o", tmp_path / "a.jsonl", "--duration", "3"], env=child_env)
    b = subprocess.Popen([PY, "-m", "jaxtop", "log", str(proc.pid), "-o", tmp_path / "b.jsonl", "--duration", "3"], env=child_env)
    time.sleep(1.5)
    c = subprocess.Popen([PY, "-m", "jaxtop", "log", str(proc.pid), "-o", tmp_path / "c.jsonl", "--duration", "1.5"], env=child_env)
    for p in (a, b, c):
        assert p.wait(timeout=30) == 0
    ra, rb, rc = (read_log(tmp_path / f"{n}.jsonl") for n in "abc")
    seq = lambda rs: {r["seq"]: r for r in rs if r["type"] == "sample"}
    sa, sb, sc = seq(ra), seq(rb), seq(rc)
    common = set(sa) & set(sb)
    assert len(common) > 10

    def same(r):
        # Two documented differences between recorders that connected a
        # moment apart: the one whose present a sample was got it with the
        # last map and sparse fields filled in, and the kept history holds
        # only the newest buffer maps (a recorder that got a sample live
        # has its map, one that got it as history may not).
        if r.get("present"):
            return None
        return dict(r, devices=[dict(d, live_arrays={k: v for k, v in d.get("live_arrays", {}).items() if k != "map"})
                                for d in r.get("devices", [])])

    assert all(same(sa[k]) == same(sb[k]) for k in common if same(sa[k]) and same(sb[k]))
    assert sum(1 for k in common if same(sa[k]) and same(sb[k])) > 10
    assert min(sc) == 1  # the late recorder received history from the start
    assert ra[0]["type"] == rc[0]["type"] == "hello"
    later = [r for r in ra if r["type"] == "sample" and r["devices"]]
    assert later and later[-1]["transfers"]["h2d"]["count_total"] > later[0]["transfers"]["h2d"]["count_total"]

    # jaxtop log stops cleanly on SIGINT and on target exit.
    d = subprocess.Popen([PY, "-m", "jaxtop", "log", str(proc.pid), "-o", tmp_path / "d.jsonl"], env=child_env)
    time.sleep(1.0)
    d.send_signal(signal.SIGINT)
    assert d.wait(timeout=10) == 0
    raw = (tmp_path / "d.jsonl").read_bytes()
    assert raw.endswith(b"\n") and len(read_log(tmp_path / "d.jsonl")) == raw.count(b"\n")

    e = subprocess.Popen([PY, "-m", "jaxtop", "log", str(proc.pid), "-o", tmp_path / "e.jsonl"], env=child_env)
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)  # KeyboardInterrupt in the target: atexit still runs
    assert e.wait(timeout=20) == 0
    re_ = read_log(tmp_path / "e.jsonl")
    assert re_[-1]["type"] == "exit"
    assert last_sample(re_).get("final") is True
    wait_for(lambda: not (sockdir / f"{proc.pid}.sock").exists(), timeout=10, what="socket removed at exit")


def test_log_without_agent_is_a_clear_error(child_env, sockdir):
    res = jaxtop_cmd("log", os.getpid(), env=child_env)
    assert res.returncode == 2
    err = res.stderr.decode().strip()
    assert len(err.splitlines()) == 1 and "jaxtop run" in err
    res = jaxtop_cmd("log", "999999999", env=child_env)
    assert res.returncode == 2 and "no process" in res.stderr.decode()
    empty = jaxtop_cmd("ls", env=child_env)
    assert empty.returncode == 0 and "jaxtop run" in empty.stdout.decode()


def _steps_per_s(lines, t0, t1):
    pts = [(float(a), int(b)) for a, b in (l.split() for l in lines) if t0 <= float(a) <= t1]
    if len(pts) < 2:
        return 0.0
    return (pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0])


def test_garbage_clients_are_dropped_and_harmless(targets, sockdir):
    proc = targets.run(TARGETS / "loop.py", "--seconds", "60")
    path = str(sockdir / f"{proc.pid}.sock")
    lines: list[str] = []
    import threading

    def pump():
        for raw in proc.stdout:
            text = raw.decode().strip()
            if text and text[0].isdigit():
                lines.append(text)

    threading.Thread(target=pump, daemon=True).start()
    good = socket.socket(socket.AF_UNIX)
    good.connect(path)
    good_stream = good.makefile("rb")
    wait_for(lambda: len(lines) > 50, what="steps")
    t_before = time.time()
    time.sleep(1.0)

    results = []
    for payload in (b"x" * (1 << 20), os.urandom(1 << 20), b'{"type": 3}\n', b"[1,2]\n", b"\xff\xfe\n"):
        bad = socket.socket(socket.AF_UNIX)
        bad.connect(path)
        bad.settimeout(10)
        try:
            bad.sendall(payload)
        except OSError:
            pass  # the agent may close on us mid-send: that is the point
        data = b""
        try:
            while True:
                chunk = bad.recv(1 << 16)
                if not chunk:
                    break
                data += chunk
        except OSError:
            pass
        bad.close()
        results.append([json.loads(l) for l in data.splitlines() if l.startswith(b"{")])
    t_after = time.time()
    for recs in results:
        errors = [r for r in recs if r["type"] == "error"]
        assert errors and errors[-1].get("fatal"), recs[-2:]
    time.sleep(0.5)
    # The good client kept receiving contiguous samples.
    good.settimeout(5)
    seqs = []
    for rec in protocol.iter_records(good_stream):
        if rec["type"] == "sample":
            seqs.append(rec["seq"])
            if len(seqs) > 30 and rec["t"] > t_after:
                break
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    good.close()
    before = _steps_per_s(lines, t_before - 1.0, t_before)
    during = _steps_per_s(lines, t_before, t_after + 0.5)
    assert proc.poll() is None
    assert during > 0.5 * before, (before, during)


def test_commands_ping_and_unknown(targets, sockdir):
    proc = targets.run(TARGETS / "loop.py", "--seconds", "30")
    s = socket.socket(socket.AF_UNIX)
    s.connect(str(sockdir / f"{proc.pid}.sock"))
    s.sendall(b'{"type":"command","name":"ping","id":7}\n{"type":"command","name":"nope","id":8}\n')
    stream = s.makefile("rb")
    replies = {}
    for rec in protocol.iter_records(stream):
        if rec["type"] == "reply":
            replies[rec["id"]] = rec
            if len(replies) == 2:
                break
    assert replies[7]["ok"] is True and replies[7]["result"] == {"pong": True}
    assert replies[8]["ok"] is False and "unknown command" in replies[8]["error"]
    s.close()


SYSTEM_PY = "/usr/bin/python3"  # reachable by another user, unlike a venv under /root


@pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists(SYSTEM_PY), reason="needs root and a system python3")
def test_other_uid_is_refused(targets, sockdir):
    import shutil
    import tempfile

    proc = targets.run(TARGETS / "loop.py", "--seconds", "30")
    # The directory (0700) and socket (0600) already keep others out; open
    # both up through a hard link to check the agent's own SO_PEERCRED check.
    open_dir = Path(tempfile.mkdtemp(prefix="jt-open-", dir="/tmp"))
    os.chmod(open_dir, 0o777)
    link = open_dir / "agent.sock"
    os.link(sockdir / f"{proc.pid}.sock", link)
    os.chmod(link, 0o666)
    code = (
        "import socket,sys; s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.settimeout(5);"
        "d=b''\nwhile True:\n c=s.recv(65536)\n if not c: break\n d+=c\nsys.stdout.buffer.write(d)"
    )
    try:
        res = subprocess.run([SYSTEM_PY, "-c", code, str(link)], user=65534, capture_output=True, timeout=30)
    finally:
        shutil.rmtree(open_dir, ignore_errors=True)
    assert res.returncode == 0, res.stderr
    recs = [json.loads(l) for l in res.stdout.splitlines()]
    assert [r["type"] for r in recs] == ["error"]
    assert "refused" in recs[0]["message"]
    assert proc.poll() is None


def test_instrument_idempotent_and_stop_restores(child_env):
    proc = subprocess.Popen(
        [PY, str(TARGETS / "instrumented.py")], env=child_env,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    first = proc.stdout.readline().decode()
    assert first.startswith("socket"), (first, proc.stderr.read())
    assert "'log'" in first  # the guard was switched to log while running
    path = first.split()[1]
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    stream = s.makefile("rb")
    recs = []
    for rec in protocol.iter_records(stream):
        recs.append(rec)
        if rec["type"] == "sample" and rec["transfers"]["h2d"]["count_total"] >= 1:
            break
    assert recs[0]["type"] == "hello"
    proc.stdin.write(b"\n")
    proc.stdin.flush()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out.strip().endswith(b"ok")
    assert err == b"stderr after stop\n"
    s.close()


def test_slow_client_gets_dropped_notice(targets, sockdir, child_env):
    env = dict(child_env, JAXTOP_CLIENT_BUFFER_BYTES="32768")
    proc = targets.run("--interval", "0.01", TARGETS / "loop.py", "--seconds", "60", env=env)
    slow = socket.socket(socket.AF_UNIX)
    slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    slow.connect(str(sockdir / f"{proc.pid}.sock"))
    fast = socket.socket(socket.AF_UNIX)
    fast.connect(str(sockdir / f"{proc.pid}.sock"))
    fast_stream = fast.makefile("rb")
    seqs = []
    kinds = set()

    def read_fast():
        for rec in protocol.iter_records(fast_stream):
            kinds.add(rec["type"])
            if rec["type"] == "sample":
                seqs.append(rec["seq"])
                if len(seqs) >= 300:
                    return

    import threading

    reader = threading.Thread(target=read_fast, daemon=True)
    reader.start()
    time.sleep(4.0)  # the slow client reads nothing meanwhile
    reader.join(timeout=30)
    assert len(seqs) >= 300
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))  # fast client lost nothing
    assert "dropped" not in kinds
    slow.settimeout(5)
    dropped = []
    for rec in protocol.iter_records(slow.makefile("rb")):
        if rec["type"] == "dropped":
            dropped.append(rec)
            break
    assert dropped and dropped[0]["count"] > 0
    assert proc.poll() is None
