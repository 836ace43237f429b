"""The demo: headless table directions on CPU, and the dashboard toggling a real child."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from conftest import PY

pytestmark = pytest.mark.slow

# Strategies whose effect CPU can measure, with the metric that must move.
MUST_MOVE = {
    "placement": "h2d_per_step",
    "donation": "new_output_bytes",
    "inplace": "alloc_bytes_per_step",
    "batching": "h2d_per_step",
    "jit": "buffers_per_step",
    "guard": "errors_per_step",
    "checkpointing": "temp_size_in_bytes",
}


@pytest.fixture
def demo_worker(child_env, monkeypatch, tmp_path):
    """A real demo workload child (small sizes), stopped after the test."""
    from jaxtop.demo.app import Worker

    for k, v in child_env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("JAXTOP_PROFILE_DIR", str(tmp_path))
    monkeypatch.delenv("XLA_PYTHON_CLIENT_PREALLOCATE", raising=False)
    worker = Worker(small=True)
    worker.start()
    yield worker
    worker.stop()


async def until(pilot, pred, timeout=60.0, what="the dashboard to show it"):
    """Pause the app until ``pred()`` is truthy; returns that value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        await pilot.pause(0.1)
        value = pred()
        if value:
            return value
    raise AssertionError(f"timed out waiting for {what}")


def test_headless_json_directions_on_cpu(child_env, tmp_path):
    env = dict(child_env, JAXTOP_PROFILE_DIR=str(tmp_path))
    res = subprocess.run([PY, "-m", "jaxtop", "demo", "--headless", "--json", "--small", "--steps", "20"],
                         env=env, capture_output=True, timeout=300)
    try:
        failed = [r for r in json.loads(res.stdout)["rows"] if r.get("ok") is False]
    except (ValueError, KeyError):
        failed = None
    assert res.returncode == 0, (failed, res.stderr.decode()[-3000:])
    data = json.loads(res.stdout)
    assert data["backend"] == "cpu"
    rows = data["rows"]
    by_key = {(r["strategy"], r.get("key")): r for r in rows}
    for strategy, key in MUST_MOVE.items():
        row = by_key[(strategy, key)]
        assert row["ok"] is True, row
        assert row["off"] != row["on"]
    guard_logged = by_key[("guard", "h2d_per_step")]
    assert guard_logged["off"] == 0 and guard_logged["on"] == 1  # allow hides, log shows every copy
    assert by_key[("placement", "h2d_per_step")]["on"] == 0
    profile = [r for r in rows if r["strategy"] == "profiling"][0]
    assert profile["ok"] is True and profile["on"] > 0
    assert list(tmp_path.glob("jaxtop-memprof-*.prof"))
    frag = [r for r in rows if r.get("key") == "fragmentation"][0]
    assert frag["na"] and "n/a on this backend" in frag["na"]  # said, not a made-up 0
    # Nothing expected failed: the table's own verdicts.
    assert not [r for r in rows if r.get("ok") is False]


def test_headless_table_is_readable(child_env):
    res = subprocess.run([PY, "-m", "jaxtop", "demo", "--headless", "--small", "--steps", "5"],
                         env=child_env, capture_output=True, timeout=300, text=True)
    assert res.returncode in (0, 1), res.stderr[-2000:]
    out = res.stdout
    assert "strategy" in out.splitlines()[1] and "moved as expected" in out
    for name in ("placement", "donation", "inplace", "batching", "jit", "guard", "profiling", "checkpointing", "fragmentation"):
        assert name in out


async def test_dashboard_toggles_each_strategy_against_a_real_child(demo_worker):
    from jaxtop.demo.app import DemoApp
    from jaxtop.demo.panel import StrategiesPanel, demo_state

    app = DemoApp(demo_worker, demo_worker.proc.pid)
    async with app.run_test(size=(160, 50)) as pilot:
        async def wait(pred, timeout=60.0):
            def ready():
                demo = demo_state(app.snapshot) if app.snapshot else None
                return demo if demo and pred(demo) else None
            return await until(pilot, ready, timeout, "the demo state to change as expected")

        demo = await wait(lambda d: len(d["strategies"]) == 9)
        panel = app.query_one(StrategiesPanel)
        for index, s in enumerate(demo["strategies"]):
            name = s["name"]
            while panel.cursor != index:
                await pilot.press("down")
            variants = s["variants"]
            latest = demo_state(app.snapshot)
            current = latest["strategies"][index]["variant"]
            nxt = lambda v: variants[(variants.index(v) + 1) % len(variants)]
            # A strategy that is not running starts in its current variant;
            # the running one flips to its next variant.
            expected = nxt(current) if latest["active"] == name else current
            await pilot.press("enter")
            if name == "profiling":
                await wait(lambda d: d["active"] == name)
                await pilot.press("enter")  # idle -> snapshot: takes a profile
                d = await wait(lambda d: (d["strategies"][index]["results"].get("snapshot") or {}).get("profile_path"))
                continue
            # Each window of the running variant is measured from the probes;
            # enter moves on until every variant has been measured.
            for _ in range(len(variants) + 1):
                d = await wait(lambda d: d["active"] == name and d["strategies"][index]["variant"] == expected
                               and expected in d["strategies"][index]["results"])
                if all(v in d["strategies"][index]["results"] for v in variants):
                    break
                expected = nxt(expected)
                await pilot.press("enter")
            res = d["strategies"][index]["results"]
            key = s["metrics"][0]["key"]
            a, b = s["metrics"][0]["pair"]
            if name in MUST_MOVE or name == "guard":
                assert res[a].get(key) != res[b].get(key), (name, res)
        # One event per switch: the dashboard reads each sample once.
        switches = [(e.t, e.text) for e in app.snapshot.events if e.kind == "strategy"]
        assert switches and len(switches) == len(set(switches)), switches
        rendered = panel.render()
        from rich.console import Console
        import io
        console = Console(width=160, record=True, file=io.StringIO(), color_system=None)
        console.print(rendered)
        text = console.export_text()
        assert "→" in text and "✓" in text


async def test_restart_time_setting_restarts_the_workload_with_its_environment(demo_worker):
    """P (preallocation) restarts the child with XLA_PYTHON_CLIENT_PREALLOCATE
    flipped; the dashboard follows the new process."""
    import os

    from jaxtop.demo.app import DemoApp
    from jaxtop.demo.panel import demo_state

    old_pid = demo_worker.proc.pid
    app = DemoApp(demo_worker, old_pid)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.snapshot is not None and demo_state(app.snapshot) is not None, 120)
        await pilot.press("P")
        await until(pilot, lambda: app.source.pids != [old_pid], 120, "a new workload pid")
        new_pid = app.source.pids[0]
        environ = open(f"/proc/{new_pid}/environ", "rb").read().split(b"\0")
        assert b"XLA_PYTHON_CLIENT_PREALLOCATE=false" in environ
        # The new workload streams into the same dashboard.
        await until(pilot, lambda: any(p.pid == new_pid and p.seq for p in app.snapshot.processes)
                    and demo_state(app.snapshot) is not None, 120, "samples from the new workload")
        assert any(e.kind == "info" and "restarted" in e.text for e in app.snapshot.events)
        with pytest.raises(ProcessLookupError):
            os.kill(old_pid, 0)  # the old child is gone


def test_workload_starts_from_a_directory_with_its_own_jaxtop(child_env, monkeypatch, tmp_path):
    """`jaxtop demo` run in a jaxtop checkout: the source `jaxtop/` in the
    current directory must not shadow the installed package in the child."""
    from jaxtop.demo.app import Worker

    fake = tmp_path / "jaxtop"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('the current directory shadowed jaxtop')\n")
    for k, v in child_env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.chdir(tmp_path)
    worker = Worker(small=True)
    try:
        pid = worker.start()
        assert pid == worker.proc.pid and worker.proc.poll() is None
    finally:
        worker.stop()
