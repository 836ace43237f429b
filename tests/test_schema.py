"""One schema of the sample: what the agent sends, the synthetic streams the
tests and benchmarks use, and what the readers read are held to
``jaxtop.wire.schema``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from jaxtop.export.formats import CSV_COLUMNS, _DEVICE_KEYS, _LIVE_KEYS, _TRANSFER_KEYS
from jaxtop.testing import synthetic
from jaxtop.wire import schema
from jaxtop.wire.prometheus import _DEVICE_GAUGES
from jaxtop.wire.protocol import DIRECTIONS

TYPES = {"bytes": (int,), "count": (int,), "ratio": (int, float), "percent": (int, float), "seconds": (int, float),
         "time": (int, float), "id": (int, str), "text": (str,)}


def check_sample(record: dict) -> list[str]:
    """Everything in ``record`` that the schema does not declare, or whose
    value is not of the declared unit's type (None: not measured, allowed)."""
    bad = []

    def check(where, obj, figures, parts=()):
        declared = {f.key: f for f in figures}
        for key, value in obj.items():
            if key in parts or key in ("available", "reason"):
                continue
            f = declared.get(key)
            if f is None:
                bad.append(f"{where}.{key}: not in the schema")
            elif value is not None and (isinstance(value, bool) or not isinstance(value, TYPES[f.unit])):
                bad.append(f"{where}.{key}: {value!r} is not {f.unit}")

    for key in record:
        if key not in schema.SAMPLE_FIELDS and key != "type":
            bad.append(f"sample.{key}: not in the schema")
    for i, dev in enumerate(record.get("devices") or []):
        check(f"devices[{i}]", dev, schema.DEVICE, schema.DEVICE_PARTS)
        if isinstance(dev.get("live_arrays"), dict):
            check(f"devices[{i}].live_arrays", dev["live_arrays"], schema.LIVE_ARRAYS, schema.LIVE_ARRAYS_PARTS)
    for d in DIRECTIONS:
        if isinstance((record.get("transfers") or {}).get(d), dict):
            check(f"transfers.{d}", record["transfers"][d], schema.TRANSFER)
    for name, figures in (("process", schema.PROCESS), ("compile", schema.COMPILE), ("donation", schema.DONATION)):
        if isinstance(record.get(name), dict):
            check(name, record[name], figures)
    return bad


def test_the_synthetic_streams_follow_the_schema():
    for record in synthetic.samples(1, 8, 0.0, 50, 0.1):
        assert check_sample(record) == []


def test_the_readers_take_their_keys_from_the_schema():
    device, live, transfer = (set(schema.keys(f)) for f in (schema.DEVICE, schema.LIVE_ARRAYS, schema.TRANSFER))
    assert set(_DEVICE_KEYS) <= device and set(_LIVE_KEYS) <= live and set(_TRANSFER_KEYS) <= transfer
    for metric, key, text in _DEVICE_GAUGES:
        assert text == schema.figure(schema.DEVICE, key).help, metric
    for column in CSV_COLUMNS:
        # Each CSV column is a declared figure (a device's, a direction's
        # with its prefix, the process's, compile's or donation's).
        base = column.split("_", 1)[1] if column.split("_", 1)[0] in DIRECTIONS else column
        known = (device | transfer | set(schema.keys(schema.PROCESS)) | {"t", "seq", "pid", "device_id"}
                 | {f"live_array_{k}" for k in ("bytes", "count")} | {"largest_live_array_bytes"}
                 | {"compiles_total", "compile_seconds_total", "donation_failed_total"})
        assert base in known, column


def test_a_figure_can_be_looked_up_and_an_unknown_one_cannot():
    assert schema.figure(schema.COMPILE, "count_total").counter
    with pytest.raises(KeyError):
        schema.figure(schema.DEVICE, "no_such_figure")


@pytest.mark.slow
def test_a_real_agents_samples_follow_the_schema(tmp_path):
    log = tmp_path / "run.jsonl"
    script = textwrap.dedent(f"""
        import time
        import jaxtop
        handle = jaxtop.instrument(interval_s=0.05, slow_interval_s=0.1, log_path={str(log)!r})
        import jax, jax.numpy as jnp, numpy as np
        f = jax.jit(lambda x: x * 2, donate_argnums=0)
        x = f(jnp.arange(1000.0))
        float(x[0])
        y = jnp.asarray(np.ones(8)) + 1
        time.sleep(1.5)
    """)
    env = dict(os.environ, JAXTOP_SOCKET_DIR=str(tmp_path), JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_force_host_platform_device_count=2")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    samples = [r for r in map(json.loads, log.read_text().splitlines()) if r.get("type") == "sample"]
    assert len(samples) >= 10
    assert any(s.get("devices") for s in samples) and any(s.get("compile") for s in samples)
    for record in samples:
        assert check_sample(record) == [], record["seq"]
