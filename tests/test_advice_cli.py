"""`jaxtop advise` as a user runs it: on a recording (plain, gzip, cut short,
hostile, 8 MiB and more: read from its last window), on a running program
(a real JAX child over its socket), text and JSON; and what it says to bad
input: one clear line, never a traceback."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest

from conftest import jaxtop_cmd
from jaxtop.cli.advise import BISECT_BYTES, advise_recording
from jaxtop.wire.safe_text import terminal_safe

TPU = Path(__file__).parent / "fixtures" / "tpu"
STALL = TPU / "training-loop-stall.jsonl.gz"


def advise(*args, env=None, timeout=120):
    env = env if env is not None else dict(os.environ, JAX_PLATFORMS="cpu")
    return jaxtop_cmd("advise", *args, env=env, timeout=timeout)


def test_text_on_a_compressed_recording_of_the_chip():
    done = advise(STALL)
    assert done.returncode == 0, done.stderr
    out = done.stdout.decode()
    assert out.startswith("== runsc pid 1221: ") or out.startswith("== pid 1221: ")
    assert "1. [runahead] train.py:27 (step): bound how far the loop runs ahead of the device  (measured)" in out
    assert "   fix:      if step % k == 0: jax.block_until_ready(loss)" in out
    assert terminal_safe(out) == out


def test_json_is_a_list_of_objects_with_the_promised_keys():
    done = advise(STALL, "--json")
    doc = json.loads(done.stdout)
    (proc,) = doc["processes"]
    assert proc["pid"] == 1221 and proc["advice"]
    for a in proc["advice"]:
        assert {"strategy", "file", "line", "function", "evidence", "gain", "fix", "basis"} <= set(a)
        assert a["strategy"] in ("placement", "donation", "in_place", "batching", "jit", "host_sync", "runahead",
                                 "checkpointing", "guard", "leak", "fragmentation")
    assert doc["read"]["malformed"] == 0 and doc["read"]["truncated"] is False


def test_a_recording_cut_short_keeps_every_whole_line(tmp_path):
    data = gzip.decompress(STALL.read_bytes())
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(gzip.compress(data)[: len(gzip.compress(data)) * 2 // 3])
    done = advise(cut)
    assert done.returncode == 0, done.stderr
    out = done.stdout.decode()
    assert "advice over the last" in out and "read: " in out and "cut short" in out


def test_hostile_lines_are_counted_and_shown_safely(tmp_path):
    lines = gzip.decompress(STALL.read_bytes()).splitlines(keepends=True)
    hostile = [b"not json\n", b"[[[[[[[[[[[[" * 400 + b"\n", b'{"type":"sample","t":"\\u001b[2J"}\n',
               b'{"type":"hello","pid":7,"argv":["\\u001b]0;owned\\u0007x.py"]}\n']
    path = tmp_path / "hostile.jsonl"
    path.write_bytes(b"".join(lines[:200] + hostile + lines[200:]))
    done = advise(path)
    assert done.returncode == 0, done.stderr
    out = done.stdout.decode()
    assert terminal_safe(out) == out and "\x1b" not in out
    assert "line(s) skipped" in out


@pytest.mark.parametrize("what", ["missing", "directory", "empty", "binary", "not-a-pid"])
def test_bad_input_gets_one_clear_line(tmp_path, what):
    if what == "missing":
        target, want = tmp_path / "nope.jsonl", "no such file"
    elif what == "directory":
        target, want = tmp_path, "no such file"
    elif what == "empty":
        target = tmp_path / "empty.jsonl"
        target.write_bytes(b"")
        want = None
    elif what == "binary":
        target = tmp_path / "bin.jsonl"
        target.write_bytes(os.urandom(100_000))
        want = None
    else:
        target, want = "99999999", "no process"
    done = advise(target)
    err = done.stderr.decode()
    assert "Traceback" not in err
    if want is None:
        assert done.returncode == 0 and "advice: n/a" in done.stdout.decode()
    else:
        assert done.returncode == 2 and want in err and len(err.strip().splitlines()) == 1


def test_a_big_recording_read_from_its_last_window_says_what_a_whole_read_says(tmp_path, monkeypatch):
    """Past BISECT_BYTES the reader bisects to the last window: the same
    advice as reading every line (the chip's recording repeated, its times
    shifted, to 3x the threshold)."""
    lines = gzip.decompress(STALL.read_bytes()).splitlines(keepends=True)
    head = [ln for ln in lines if b'"type":"hello"' in ln or b'"type":"backend"' in ln]
    body = [json.loads(ln) for ln in lines if ln not in head and b'"type":"exit"' not in ln]
    span = max(r["t"] for r in body if isinstance(r.get("t"), (int, float))) - body[0]["t"] + 1
    path = tmp_path / "big.jsonl"
    with open(path, "wb") as f:
        f.writelines(head)
        lap = 0
        while f.tell() < 3 * BISECT_BYTES:
            for r in body:
                if isinstance(r.get("t"), (int, float)):
                    r = {**r, "t": r["t"] + lap * span}
                f.write(json.dumps(r).encode() + b"\n")
            lap += 1
    fast, _ = advise_recording(str(path), 60.0)
    monkeypatch.setenv("JAXTOP_ADVISE_WHOLE", "1")
    whole, _ = advise_recording(str(path), 60.0)
    def key(processes):
        report = processes[-1][1].evaluate()
        return [(a.strategy, a.where) for a in report.advice]
    assert key(fast) == key(whole) and key(fast)


def test_on_a_running_program(targets, child_env, tmp_path):
    """A real JAX child missing strategies: its agent's history, then live
    samples, until the window holds enough."""
    program = tmp_path / "loop.py"
    program.write_text(
        "import sys, time\nimport numpy as np\nimport jax, jax.numpy as jnp\n"
        "step = jax.jit(lambda p, x: (p * 0.999, jnp.sum(x @ p)))\n"
        "p = jnp.ones((128, 128))\nprint('ready', flush=True)\nend = time.time() + 40\n"
        "while time.time() < end:\n"
        "    p, loss = step(p, np.ones((32, 128), np.float32))  # LINE\n"
        "    loss.item()\n    time.sleep(0.01)\n")
    proc = targets.run(program)
    targets.wait_ready(proc)
    line = next(i for i, text in enumerate(program.read_text().splitlines(), 1) if "# LINE" in text)
    # Asked at once: it watches the young program until 10 s of samples are in.
    done = advise(proc.pid, "--json", env=child_env, timeout=60)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["processes"][0]["span_s"] >= 10
    found = {(a["strategy"], a["line"]) for a in doc["processes"][0]["advice"]}
    assert {("placement", line), ("host_sync", line + 1), ("donation", line)} <= found, found
