"""OOM censuses of real programs that run out of memory (tests/targets/oom_hold.py): uncaught, caught, in a thread, injected, and bounded with 10,000 live arrays."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import shutil

import pytest

from jaxtop.dashboard import oom_report
from jaxtop.probes import oom
from jaxtop.wire.units import fmt_bytes
from test_oom import HOLD, LISTCOMP, ROOT, decoded, marker_line  # helpers shared with that module

MiB, GiB = 1 << 20, 1 << 30

#: How a comprehension's frame is named (Python < 3.12 runs it in a frame of its own).


# ---------------------------------------------------------------------------
# Real programs (slow)
# ---------------------------------------------------------------------------

def _run_hold(env, tmp_path, mode, **extra):
    env = dict(env)
    env["OOM_TARGET_MODE"] = mode
    env["JAXTOP_OOM_DIR"] = str(tmp_path)
    env.update({k: str(v) for k, v in extra.items()})
    return subprocess.run([sys.executable, str(HOLD)], env=env, capture_output=True, text=True, timeout=180,
                          cwd=str(tmp_path))


def _note_free(stderr: str) -> tuple[str, list[str]]:
    lines = stderr.splitlines(keepends=True)
    notes = [line for line in lines if line.startswith("jaxtop: out of memory")]
    return "".join(line for line in lines if not line.startswith("jaxtop: out of memory")), notes


def _only_census(tmp_path) -> dict:
    """The one census file, as the agent wrote it; its every part has its
    declared type (``decoded`` asserts that nothing reads as odd)."""
    files = sorted(tmp_path.glob("jaxtop-oom-*.json"))
    assert len(files) == 1, files
    census = json.loads(files[0].read_text())
    decoded(census)
    return census


@pytest.mark.slow
def test_uncaught_oom_census_names_the_arrays_and_sites_and_leaves_the_run_alone(child_env, tmp_path):  # (a)
    plain_dir, census_dir = tmp_path / "plain", tmp_path / "census"
    plain_dir.mkdir(), census_dir.mkdir()
    log = census_dir / "run.jsonl"
    plain = _run_hold(child_env, plain_dir, "plain")
    inst = _run_hold(child_env, census_dir, "census", OOM_TARGET_LOG=log)
    assert plain.returncode == inst.returncode == 1, inst.stderr[-3000:]
    assert inst.stdout == plain.stdout == "holding 6 2\n"
    stderr, notes = _note_free(inst.stderr)
    assert stderr == plain.stderr  # the traceback, byte for byte
    assert "RESOURCE_EXHAUSTED: Out of memory allocating 2147483648 bytes." in stderr
    assert not list(plain_dir.glob("jaxtop-oom-*"))
    census = _only_census(census_dir)
    assert notes == [(f"jaxtop: out of memory: census written to {census['path']} "
                      f"(read it with: jaxtop oom {census['path']})\n")]
    assert inst.stderr.endswith(notes[0])  # after the program's own traceback

    assert census["request"]["bytes"] == 2 * GiB and census["trigger"]["uncaught"]
    assert census["trigger"]["raised_at"]["line"] == marker_line(HOLD, "OOM_LINE")
    groups = {(tuple(g["shape"]), g["dtype"]): g for g in census["arrays"]["groups"]}
    assert (groups[((32 * MiB,), "float32")]["count"], groups[((32 * MiB,), "float32")]["bytes"]) == (6, 6 * 128 * MiB)
    assert (groups[((16 * MiB,), "float32")]["count"], groups[((16 * MiB,), "float32")]["bytes"]) == (2, 2 * 64 * MiB)
    assert groups[((1024, 1024), "float32")]["bytes"] == 4 * MiB and groups[((1024,), "float32")]["bytes"] == 4096
    held = 6 * 128 * MiB + 2 * 64 * MiB + 4 * MiB + 4096
    assert held <= census["arrays"]["bytes"] <= held + 4096
    sites = {s["site"]: s for s in census["sites"]["top"]}
    cache = sites[f"oom_hold.py:{marker_line(HOLD, 'CACHE_LINE')} in make_cache{LISTCOMP}"]
    assert (cache["count"], cache["bytes"], cache["file"]) == (6, 6 * 128 * MiB, str(HOLD))
    buffers = sites[f"oom_hold.py:{marker_line(HOLD, 'BUFFERS_LINE')} in make_buffers{LISTCOMP}"]
    assert (buffers["count"], buffers["bytes"]) == (2, 2 * 64 * MiB)
    params = sites[f"oom_hold.py:{marker_line(HOLD, 'PARAMS_LINE')} in params"]
    assert (params["count"], params["bytes"]) == (2, 4 * MiB + 4096)
    assert census["sites"]["top"][0]["site"] == cache["site"]
    assert census["verdict"].startswith(f"live arrays hold {fmt_bytes(census['arrays']['bytes'])} of the process's RSS")
    assert "(RLIMIT_AS;" in census["verdict"] and census["complete"]
    assert census["timeline"]["t"] and census["timeline"]["last_is_census"]
    # The stream carries it too, and `jaxtop oom` reads it from the recording.
    recorded = oom_report.load_censuses(str(log))
    assert [c.id for c in recorded] == [census["id"]] and recorded[0].trigger.uncaught
    assert not recorded[0].odd and recorded[0] == decoded(census)  # the stream's copy is the file's
    code = "import sys; from jaxtop.dashboard.oom_report import main; sys.exit(main(sys.argv[1:]))"
    report = subprocess.run([sys.executable, "-c", code, census["path"]], capture_output=True, text=True, timeout=60)
    assert report.returncode == 0 and f"{cache['site']}: 6 arrays, 768 MiB" in report.stdout


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("gdb") is None or sys.platform != "linux" or os.uname().machine != "x86_64",
                    reason="gdb injection: Linux x86-64 with gdb")
def test_an_injected_agent_takes_the_census_and_leaves_the_run_alone(child_env, tmp_path):  # (a), attached
    # A plain program, attached to while it holds its arrays (jaxtop log
    # --inject), then running out of memory: the census names the same
    # groups and the allocation sites made before the agent came.
    from conftest import wait_for

    plain_dir, census_dir = tmp_path / "plain", tmp_path / "census"
    plain_dir.mkdir(), census_dir.mkdir()
    plain = _run_hold(child_env, plain_dir, "plain")
    go = census_dir / "go"
    env = dict(child_env, OOM_TARGET_MODE="plain", JAXTOP_OOM_DIR=str(census_dir), OOM_TARGET_WAIT=str(go))
    proc = subprocess.Popen([sys.executable, str(HOLD)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=str(census_dir))
    try:
        assert proc.stdout.readline() == "holding 6 2\n"
        log = census_dir / "attached.jsonl"
        attach = subprocess.run([sys.executable, "-m", "jaxtop", "log", str(proc.pid), "--inject", "-o", str(log),
                                 "--duration", "1"], env=child_env, capture_output=True, text=True, timeout=120)
        assert attach.returncode == 0, attach.stderr
        go.touch()
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == plain.returncode == 1, err[-3000:]
    assert "holding 6 2\n" + out == plain.stdout
    stderr, _ = _note_free(err)
    assert stderr == plain.stderr  # the traceback, byte for byte
    wait_for(lambda: list(census_dir.glob("jaxtop-oom-*.json")), timeout=10, what="the census file")
    census = _only_census(census_dir)
    assert census["request"]["bytes"] == 2 * GiB and census["trigger"]["uncaught"]
    groups = {(tuple(g["shape"]), g["dtype"]): g for g in census["arrays"]["groups"]}
    assert (groups[((32 * MiB,), "float32")]["count"], groups[((32 * MiB,), "float32")]["bytes"]) == (6, 6 * 128 * MiB)
    assert (groups[((16 * MiB,), "float32")]["count"], groups[((16 * MiB,), "float32")]["bytes"]) == (2, 2 * 64 * MiB)
    sites = {s["site"]: s for s in census["sites"]["top"]}
    cache = sites[f"oom_hold.py:{marker_line(HOLD, 'CACHE_LINE')} in make_cache{LISTCOMP}"]
    assert (cache["count"], cache["bytes"]) == (6, 6 * 128 * MiB)


@pytest.mark.slow
def test_caught_oom_is_recorded_and_the_program_goes_on(child_env, tmp_path):  # (b)
    plain_dir, census_dir = tmp_path / "plain", tmp_path / "census"
    plain_dir.mkdir(), census_dir.mkdir()
    log = census_dir / "run.jsonl"
    plain = _run_hold(child_env, plain_dir, "plain", OOM_TARGET_CATCH=1)
    inst = _run_hold(child_env, census_dir, "census", OOM_TARGET_CATCH=1, OOM_TARGET_LOG=log)
    assert plain.returncode == inst.returncode == 0, inst.stderr[-3000:]
    assert inst.stdout == plain.stdout
    assert "went on: 8.0 6 2" in inst.stdout
    assert inst.stderr == plain.stderr  # no note: nothing was uncaught
    census = _only_census(census_dir)
    assert census["trigger"]["how"] == "raised" and not census["trigger"]["uncaught"]
    assert census["trigger"]["raised_at"]["line"] == marker_line(HOLD, "CAUGHT_OOM_LINE")
    assert census["request"]["bytes"] == 2 * GiB
    assert census["arrays"]["bytes"] >= 6 * 128 * MiB + 2 * 64 * MiB
    assert [c.id for c in oom_report.load_censuses(str(log))] == [census["id"]]


@pytest.mark.slow
def test_oom_in_a_worker_thread_goes_through_threading_excepthook(child_env, tmp_path):
    plain_dir, census_dir = tmp_path / "plain", tmp_path / "census"
    plain_dir.mkdir(), census_dir.mkdir()
    plain = _run_hold(child_env, plain_dir, "plain", OOM_TARGET_THREAD=1)
    inst = _run_hold(child_env, census_dir, "census", OOM_TARGET_THREAD=1)
    assert plain.returncode == inst.returncode == 0, inst.stderr[-3000:]
    assert inst.stdout == plain.stdout and "main goes on: 6 2" in inst.stdout
    stderr, notes = _note_free(inst.stderr)
    assert stderr == plain.stderr and len(notes) == 1
    census = _only_census(census_dir)
    assert census["trigger"]["thread"] == "loader" and census["trigger"]["uncaught"]


@pytest.mark.slow
def test_ten_thousand_live_arrays_census_is_bounded():  # (d)
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=2")
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "oom_census.py"), "--arrays", "10000",
                          "--repeats", "2", "--json"], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout)
    assert result["live_arrays_seen"] >= 10000 and result["grouped"] >= 10000 and result["complete"]
    assert result["max_s"] < oom.DEFAULT_BUDGET_S
    tight = result["tight_budget"]
    # A census that cannot finish says what it skipped, and still ends in
    # about its budget (one 256-array slice and the cheap parts past it).
    assert tight["seconds"] < 0.01 + 0.2
    assert {s["part"] for s in tight["skipped"]} >= {"sites"}
