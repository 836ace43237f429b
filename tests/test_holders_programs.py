"""Holders, labels and host syncs in real programs (tests/targets/holders_*.py): what their agent recorded."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest


from conftest import PY, TARGETS, wait_for


# -- real programs ---------------------------------------------------------------------------------------------

def marker_lines(path: Path, tag: str) -> dict[str, int]:
    """``# TAG:name`` markers of a target -> line numbers."""
    out = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        m = re.search(rf"# {tag}:?(\w*)", line)
        if m:
            out[m.group(1) or tag] = n
    return out


def read_log(path: Path) -> list[dict]:
    out = []
    if path.exists():
        for line in path.read_bytes().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                pass  # the last line may be half written
    return out


def holders_records(path: Path) -> list[dict]:
    return [r["holders"] for r in read_log(path) if r.get("type") == "sample" and isinstance(r.get("holders"), dict)]


def start(script: str, env, *args, stdin=None):
    return subprocess.Popen([PY, str(TARGETS / script), *map(str, args)], env=env, stdin=stdin,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def read_line(proc, prefix: str, timeout=30.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline().decode()
        if not line:
            break
        if line.startswith(prefix):
            return line.strip()
    raise AssertionError(f"no {prefix!r} line; stderr: {proc.stderr.read().decode()[-2000:] if proc.poll() is not None else ''}")


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_leaking_program_is_flagged_at_the_leaking_line_with_its_rate(child_env, tmp_path):
    from jaxtop.wire.client import AgentConnection

    log = tmp_path / "leak.jsonl"
    period = 0.05  # one float32[256] every 50 ms: 1200 arrays/min, 1200 KiB/min
    proc = start("holders_leak.py", child_env, "--log", log, "--leak", "--period", period, "--seconds", 25)
    try:
        read_line(proc, "ready")
        line = marker_lines(TARGETS / "holders_leak.py", "LEAK")["LEAK"]

        def flagged():
            for rec in holders_records(log):
                if any(s.get("suspect") for s in rec["sites"]):
                    return rec
            return None

        rec = wait_for(flagged, timeout=20, what="a leak suspect")
        suspects = [s for s in rec["sites"] if s.get("suspect")]
        assert [(s["site"], s["function"]) for s in suspects] == [(f"holders_leak.py:{line}", "log_metrics")]
        growth = suspects[0]["growth"]
        assert growth["count_per_min"] == pytest.approx(60 / period, rel=0.1)
        assert growth["bytes_per_min"] == pytest.approx(1024 * 60 / period, rel=0.1)
        events = [e for r in read_log(log) if r.get("type") == "sample" for e in r.get("events") or []]
        assert any(e["kind"] == "leak_suspect" and f"holders_leak.py:{line} log_metrics" in e["text"] for e in events)

        with AgentConnection.open(proc.pid) as conn:
            conn.send_command("holders_mark", {})
            seen = holders_records(log)[-1]["seq"]

            def marked_later():
                recs = [r for r in holders_records(log) if r["seq"] > seen + 1 and "mark" in r]
                return recs[-1] if recs else None

            after = wait_for(marked_later, timeout=10, what="a record after the mark")
        leak = next(s for s in after["sites"] if s["site"] == f"holders_leak.py:{line}")
        assert leak["mark"]["count"] > 0 and leak["mark"]["bytes"] == 1024 * leak["mark"]["count"]
        steady = [s for s in after["sites"] if s["site"] != f"holders_leak.py:{line}" and not s.get("library")]
        assert all(abs(s["mark"]["count"]) <= 2 for s in steady), steady
    finally:
        proc.kill()
        proc.communicate(timeout=10)


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_who_holds_a_leak_is_named_as_the_program_names_it(child_env, tmp_path):
    """``holders_who`` over the socket: the leak suspect's arrays are found
    kept by the module's list ``metrics`` (the program's name), and a named
    site with nothing leaking says what keeps its arrays, or that none is."""
    from jaxtop.wire.client import AgentConnection

    log = tmp_path / "leak.jsonl"
    proc = start("holders_leak.py", child_env, "--log", log, "--leak", "--period", 0.05, "--seconds", 40)
    try:
        read_line(proc, "ready")
        line = marker_lines(TARGETS / "holders_leak.py", "LEAK")["LEAK"]
        wait_for(lambda: any(s.get("suspect") for rec in holders_records(log) for s in rec["sites"]), timeout=25,
                 what="a leak suspect")
        with AgentConnection.open(proc.pid) as conn:
            asked = conn.send_command("holders_who", {})

            def reply():
                for raw in conn.lines(poll_s=0.2):
                    rec = json.loads(raw)
                    if rec.get("type") == "reply" and rec.get("id") == asked:
                        return rec
                return None

            rec = reply()
        assert rec is not None and rec["ok"], rec
        who = rec["result"]["who"]
        assert [(w["file"].rsplit("/", 1)[-1], w["line"]) for w in who] == [("holders_leak.py", line)], who
        assert who[0]["arrays"] == 3 and who[0]["paths"] == {"__main__.metrics[…]": 3}, who
        assert who[0]["complete"] and rec["result"]["longest_piece_s"] < 0.25, rec["result"]  # (wall time: a loaded machine)
    finally:
        proc.kill()
        proc.communicate(timeout=10)


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_steady_program_is_never_flagged(child_env, tmp_path):
    log = tmp_path / "steady.jsonl"
    proc = start("holders_leak.py", child_env, "--log", log, "--seconds", 9)
    try:
        read_line(proc, "ready")
        proc.wait(timeout=40)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=10)
    records = holders_records(log)
    assert len(records) >= 12  # a profile every 0.5 s over 9 s
    assert not [s for rec in records for s in rec["sites"] if s.get("suspect")]
    prefetch = marker_lines(TARGETS / "holders_leak.py", "PREFETCH")["PREFETCH"]
    counts = [s["count"] for rec in records for s in rec["sites"] if s["line"] == prefetch and s["function"] == "<module>"]
    assert len(set(counts)) > 1  # the queue did go up and down while nothing was flagged
    assert not [e for r in read_log(log) if r.get("type") == "sample" for e in r.get("events") or []
                if e["kind"] == "leak_suspect"]


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_site_bytes_and_labels_match_the_programs_own_accounting(child_env, tmp_path):
    log = tmp_path / "sites.jsonl"
    path = TARGETS / "holders_sites.py"
    proc = start("holders_sites.py", child_env, "--log", log, stdin=subprocess.PIPE)
    try:
        ready_t = float(read_line(proc, "ready").split()[1])
        lines = marker_lines(path, "SITE")

        def profiled():
            recs = [r for r in holders_records(log) if r["t"] > ready_t]
            return recs[0] if recs else None

        rec = wait_for(profiled, timeout=20, what="a profile after ready")
        truth = next(r["truth"] for r in read_log(log) if r.get("type") == "sample" and "truth" in r)["truth"]
        per_line: dict[int, list] = {}
        for site in rec["sites"]:
            if site["file"] == str(path):
                got = per_line.setdefault(site["line"], [0, 0, {}])
                got[0] += site["bytes"]
                got[1] += site["count"]
                for dev, (b, _c) in site["devices"].items():
                    got[2][dev] = got[2].get(dev, 0) + b
        for name, want in truth.items():
            got = per_line.get(lines[name])
            assert got is not None, (name, per_line)
            assert (got[0], got[1]) == (want["bytes"], want["count"]), name
            if "devices" in want:
                assert sorted(got[2].values()) == sorted(want["devices"].values())
        labelled = wait_for(lambda: next((r["labels"] for r in read_log(log) if r.get("type") == "sample" and r.get("labels")), None),
                            timeout=10, what="a labels field")
        assert labelled["trees"][0]["name"] == "params" and labelled["trees"][0]["bytes"] == truth["params"]["bytes"]

        proc.stdin.write(b"\n")
        proc.stdin.flush()
        dropped_t = float(read_line(proc, "dropped").split()[1])

        def freed():
            recs = [r for r in read_log(log) if r.get("type") == "sample" and r["t"] > dropped_t]
            lab = [r["labels"] for r in recs if r.get("labels")]
            prof = [r["holders"] for r in recs if r.get("holders")]
            return (lab[-1], prof[-1]) if lab and prof else None

        lab, prof = wait_for(freed, timeout=15, what="labels and a profile after the drop")
        assert lab["trees"][0]["bytes"] == 0 and lab["trees"][0]["alive"] == 0
        assert not [s for s in prof["sites"] if s["file"] == str(path) and s["line"] == lines["params"]]
        proc.stdin.write(b"\n")
        proc.stdin.flush()
        proc.wait(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=10)
    # The exports carry the profiles and the labels: the same bytes per site and per tree.
    site_rows = _export(log, "holders-csv", tmp_path)
    at = [r for r in site_rows if float(r["t"]) == rec["t"] and r["file"] == str(path)]
    for name, want in truth.items():
        mine = [r for r in at if int(r["line"]) == lines[name]]
        assert (sum(int(r["bytes"]) for r in mine), sum(int(r["count"]) for r in mine)) == (want["bytes"], want["count"])
    tree_rows = _export(log, "labels-csv", tmp_path)
    assert any(r["name"] == "params" and int(r["bytes"]) == truth["params"]["bytes"] for r in tree_rows)
    assert [r for r in tree_rows if r["name"] == "params"][-1]["bytes"] == "0"  # dropped: freed
    trace = _export(log, "perfetto", tmp_path)
    labelled = [e["args"] for e in trace["traceEvents"] if e.get("name") == "labelled trees (bytes)"]
    assert any(a.get("params") == truth["params"]["bytes"] for a in labelled) and labelled[-1]["params"] == 0
    assert any(e.get("name") == "memory by allocation site (bytes)" for e in trace["traceEvents"])


def _export(log, fmt: str, tmp_path):
    """``jaxtop export`` of a recording: CSV rows as dicts, or the trace's JSON."""
    import csv

    out = tmp_path / f"export.{fmt}"
    res = subprocess.run([PY, "-m", "jaxtop", "export", str(log), "--format", fmt, "-o", str(out)],
                         capture_output=True, timeout=60)
    assert res.returncode == 0, res.stderr.decode()
    if fmt == "perfetto":
        return json.loads(out.read_text())
    with open(out, newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_host_syncs_counted_per_line_with_the_output_unchanged(child_env, tmp_path):
    path = TARGETS / "holders_syncs.py"
    log = tmp_path / "syncs.jsonl"
    with_probe = subprocess.run([PY, str(path), "--log", str(log)], env=child_env, capture_output=True, timeout=60)
    without = subprocess.run([PY, str(path), "--no-probe"], env=child_env, capture_output=True, timeout=60)
    value_only = subprocess.run([PY, str(path), "--numpy-hooks", "auto"], env=dict(child_env, JAXTOP_NUMPY_HOOKS=""),
                                capture_output=True, timeout=60)
    for run in (with_probe, without, value_only):
        assert run.returncode == 0, run.stderr.decode()[-2000:]
    out_with = with_probe.stdout.decode().splitlines()
    out_without = without.stdout.decode().splitlines()
    assert "restored True" in out_with  # jax.Array and numpy exactly as before start()
    program_output = [l for l in out_with if not l.startswith(("counts ", "restored "))]
    assert program_output == [l for l in out_without if not l.startswith(("counts ", "restored "))]
    lines = {k: str(v) for k, v in marker_lines(path, "READ").items()}
    expected = {
        lines["float"]: {"float": 3}, lines["item"]: {"item": 1}, lines["asarray"]: {"asarray": 1},
        lines["print"]: {"str": 1}, lines["bool"]: {"bool": 2}, lines["int"]: {"int": 1},
        lines["tolist"]: {"tolist": 1},
        lines["sharded"]: {"asarray": 2},  # 2 arrays read twice each: the second read is jax's host copy
        lines["replicated"]: {"item": 1},
    }
    counts = json.loads(next(l for l in out_with if l.startswith("counts "))[len("counts "):])
    assert counts == expected
    streamed = [r["host_syncs"] for r in read_log(log) if r.get("type") == "sample" and r.get("host_syncs")]
    final = streamed[-1]
    got = {str(s["line"]): s["kinds"] for s in final["sites"] if s["file"] == str(path)}
    assert got == expected and final["available"] and final["numpy_hooks"]
    # The export carries them: a row per reading line of each record, and a counter in the trace.
    rows = _export(log, "host-syncs-csv", tmp_path)
    last_t = max(float(r["t"]) for r in rows)
    exported = {r["line"]: dict(kv.split("=") for kv in r["kinds"].split()) for r in rows
                if float(r["t"]) == last_t and r["file"] == str(path)}
    assert exported == {line: {k: str(v) for k, v in kinds.items()} for line, kinds in expected.items()}
    trace = _export(log, "perfetto", tmp_path)
    reads = [e["args"]["total"] for e in trace["traceEvents"] if e.get("name") == "host reads of device arrays"]
    assert reads and reads[-1] == final["count"]
    # By default numpy is not wrapped: reads numpy takes through __array__
    # (the GPU case, sharded arrays) count exactly once too, x.item() through
    # jax's own method; np.asarray of a single-device CPU array goes unseen.
    out_value = value_only.stdout.decode().splitlines()
    assert "restored True" in out_value
    counts = json.loads(next(l for l in out_value if l.startswith("counts "))[len("counts "):])
    assert counts == {k: v for k, v in expected.items() if k != lines["asarray"]}
