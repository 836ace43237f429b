"""``jaxtop export --format perfetto --with-jax-profile DIR``: JAX's profiler
trace on jaxtop's clock. A hand-built XSpace (pure), then a real program
profiled by ``jax.profiler`` under jaxtop, where a ``TraceAnnotation``
opened right after a jaxtop event must land within 1 ms of it."""

from __future__ import annotations

import gzip
import json
import subprocess
import textwrap

import pytest

from conftest import PY
from test_holders import _field as field  # the tests' one protobuf writer
from jaxtop.export.jax_profile import PID_OFFSET, JaxProfileError, load, merge, parse_xspace


def metadata(key: int, name: str) -> bytes:
    return field(1, key) + field(2, field(1, key) + field(2, name.encode()))


START_NS = 1_796_000_000_123_456_789


def xspace() -> bytes:
    env = field(2, b"Task Environment") + field(5, metadata(7, "profile_start_time")) + field(
        6, field(1, 7) + field(3, START_NS))
    events = field(4, field(1, 1) + field(2, 40_000_000) + field(3, 2_000_000_000))  # at 40 us, 2 ms long
    events += field(4, field(1, 2) + field(2, 50_000_000) + field(3, 10_000))
    host = field(2, b"/host:CPU") + field(4, metadata(1, "step 3")) + field(4, metadata(2, "other")) + field(
        3, field(3, 5_000) + events)  # the line starts 5 us after the profile
    return field(1, env) + field(1, host) + field(4, b"vm")


def test_the_xspace_gives_the_profiles_start_and_its_events():
    events, start = parse_xspace(xspace())
    assert start == START_NS
    assert events == [("step 3", 45_000, 2_000_000_000), ("other", 55_000, 10_000)]
    with pytest.raises(JaxProfileError, match="not a profiler XSpace"):
        parse_xspace(b"\x0a\xff\xff\xff\xff\x0f")


def write_run(tmp_path, trace_events, space=None):
    run = tmp_path / "plugins" / "profile" / "2026_12_05_10_00_00"
    run.mkdir(parents=True)
    (run / "vm.xplane.pb").write_bytes(xspace() if space is None else space)
    with gzip.open(run / "vm.trace.json.gz", "wt") as f:
        json.dump({"displayTimeUnit": "ns", "traceEvents": trace_events}, f)
    return run


def test_merge_puts_the_profile_on_jaxtops_clock(tmp_path):
    write_run(tmp_path, [
        {"ph": "M", "name": "process_name", "pid": 701, "args": {"name": "/host:CPU"}},
        {"ph": "X", "pid": 701, "tid": 1, "ts": 45.0, "dur": 2000.0, "name": "step 3"},
        {"ph": "X", "pid": 701, "tid": 1, "ts": 55.0, "dur": 0.01, "name": "other"},
    ])
    profile = load(str(tmp_path))
    assert profile.matched == 2 and profile.base_us == pytest.approx(START_NS / 1000)
    ours = json.dumps({"traceEvents": [{"ph": "i", "name": "mark", "ts": 1_796_000_000_123_500, "pid": 42, "tid": 0}]})
    merged = json.loads(merge(ours, profile))["traceEvents"]
    step = next(e for e in merged if e.get("name") == "step 3")
    assert step["ts"] == pytest.approx(START_NS / 1000 + 45.0) and step["pid"] == 701 + PID_OFFSET
    assert next(e for e in merged if e.get("ph") == "M")["args"]["name"] == "jax profiler: /host:CPU"
    assert merged[0]["name"] == "mark"  # jaxtop's own events first, untouched


def test_what_cannot_be_placed_is_refused_with_the_reason(tmp_path):
    with pytest.raises(JaxProfileError, match="no JAX profile under"):
        load(str(tmp_path))
    run = write_run(tmp_path, [{"ph": "X", "ts": 1.0, "dur": 1.0, "name": "nowhere"}])
    with pytest.raises(JaxProfileError, match="cannot be put on one clock"):
        load(str(tmp_path))
    (run / "vm.xplane.pb").write_bytes(field(1, field(2, b"/host:CPU")))
    with pytest.raises(JaxProfileError, match="no profile_start_time"):
        load(str(tmp_path))


@pytest.mark.slow
def test_a_trace_annotation_lands_within_a_millisecond_of_jaxtops_mark(child_env, tmp_path):
    log, profile_dir, out = tmp_path / "run.jsonl", tmp_path / "profile", tmp_path / "merged.json"
    script = tmp_path / "profiled.py"
    script.write_text(textwrap.dedent(f"""
        import time
        import jaxtop
        handle = jaxtop.instrument(interval_s=0.05, log_path={str(log)!r})
        import jax, jax.numpy as jnp
        step = jax.jit(lambda x: (x @ x).sum())
        x = jnp.ones((256, 256))
        step(x).block_until_ready()
        with jax.profiler.trace({str(profile_dir)!r}):
            for i in range(5):
                handle.agent.post_event("mark", text=f"step {{i}}")
                with jax.profiler.TraceAnnotation(f"step {{i}}"):
                    step(x).block_until_ready()
                time.sleep(0.02)
        time.sleep(0.3)
    """))
    run = subprocess.run([PY, str(script)], env=child_env, capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr[-2000:]
    res = subprocess.run([PY, "-m", "jaxtop", "export", str(log), "--format", "perfetto", "--with-jax-profile",
                          str(profile_dir), "-o", str(out)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    events = json.loads(out.read_text())["traceEvents"]
    marks = {e["args"]["text"]: e["ts"] for e in events if e.get("ph") == "i" and e.get("name") == "mark"}
    steps = {e["name"]: e["ts"] for e in events if e.get("ph") == "X" and str(e.get("name", "")).startswith("step ")}
    assert set(marks) == set(steps) == {f"step {i}" for i in range(5)}
    for name, mark in marks.items():
        assert 0 <= steps[name] - mark < 1000, (name, steps[name] - mark)  # µs: the annotation opens just after
    print("annotation - mark (us):", sorted(round(steps[n] - m, 1) for n, m in marks.items()))
    # Asked of a CSV, or of a folder without a profile: a clear error, nothing written.
    bad = subprocess.run([PY, "-m", "jaxtop", "export", str(log), "--format", "csv", "--with-jax-profile",
                          str(profile_dir)], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "goes with --format perfetto" in bad.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    bad = subprocess.run([PY, "-m", "jaxtop", "export", str(log), "--format", "perfetto", "--with-jax-profile",
                          str(empty), "-o", str(tmp_path / "x.json")], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "no JAX profile under" in bad.stderr and not (tmp_path / "x.json").exists()
