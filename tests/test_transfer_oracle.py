"""tests/transfer_oracle.py is right on tiny programs: exact per-line counts
from JAX's own transfer guard, the program's output and exit unchanged."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import transfer_oracle  # noqa: E402
from transfer_oracle import oracle_counts, oracle_run  # noqa: E402

pytest.importorskip("jax")


def _env():
    env = dict(os.environ)
    env["JAX_PLATFORMS"] = "cpu"
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    for k in ("JAX_TRANSFER_GUARD", "TF_CPP_MIN_LOG_LEVEL"):
        env.pop(k, None)
    return env


def _write(tmp_path, name, source):
    source = textwrap.dedent(source).lstrip()
    path = tmp_path / name
    path.write_text(source)
    lines = {}
    for n, text in enumerate(source.splitlines(), 1):
        if "# L:" in text:
            lines[text.split("# L:")[1].strip()] = n
    return path, lines


TINY = """
    import os
    import sys
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import numpy as np
    import jax
    import jax.numpy as jnp

    double = jax.jit(lambda x: x * 2)
    scale = jax.jit(lambda x, s: x * s)
    host = np.ones(8, np.float32)
    dev = jax.device_put(np.arange(8, dtype=np.float32))  # explicit: not counted

    def helper(v):
        return jnp.sin(v)  # L:helper

    sys.stderr.write("user stderr line\\n")
    sys.stderr.write("partial... ")
    sys.stderr.flush()
    os.write(2, b"raw fd 2 \\xff bytes\\n")
    for i in range(7):
        out = double(host)  # L:loop
    for i in range(3):
        out = scale(dev, 1.5)  # L:scalar
    both = helper(host) + helper(host)  # L:caller
    nested = scale(helper(host), np.float32(2.0))  # L:nested
    none = jnp.cos(dev) * out  # L:none
    code = jax.jit(lambda v: v[3].astype(jnp.int4))(dev)
    as_float = float(code)  # L:d2h
    as_float32 = float(out[0] if False else jax.jit(jnp.sum)(dev))  # L:d2h-cpu
    print("stdout ok", as_float)
"""


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path, lines = _write(tmp_path_factory.mktemp("tiny"), "tiny.py", TINY)
    result, proc = oracle_run(path, env=_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    counts = {(r["file"], r["line"], r["direction"]): r["count"] for r in result["lines"]}
    return path, lines, result, proc, counts


def test_numpy_argument_every_call_counted(tiny):
    _, lines, _, _, counts = tiny
    # The first (compiling) call's transfer included: 7 calls, 7 h2d.
    assert counts[("tiny.py", lines["loop"], "h2d")] == 7


def test_python_scalar_counted_on_its_line(tiny):
    _, lines, _, _, counts = tiny
    assert counts[("tiny.py", lines["scalar"], "h2d")] == 3


def test_helper_line_not_caller_line(tiny):
    _, lines, result, _, counts = tiny
    # Two calls on the caller line, one more under `nested`: counted once each,
    # though `nested` itself failed its disallow attempt and ran again.
    assert counts[("tiny.py", lines["helper"], "h2d")] == 3
    assert ("tiny.py", lines["caller"], "h2d") not in counts
    assert counts[("tiny.py", lines["nested"], "h2d")] == 1
    assert result["disagreements"] == []
    assert result["unattributed"] == {}


def test_line_without_transfers_absent(tiny):
    _, lines, _, _, counts = tiny
    assert not [k for k in counts if k[1] == lines["none"]]
    assert set(k[1] for k in counts) == {lines[n] for n in ("helper", "loop", "scalar", "nested", "d2h")}


def test_float_of_device_array_is_d2h(tiny):
    _, lines, result, _, counts = tiny
    # On CPU, JAX applies the guard only to a copying read: sub-byte dtypes
    # (int4 here) are copied to unpack them; a float32 buffer is read in
    # place and JAX logs nothing.
    assert counts[("tiny.py", lines["d2h"], "d2h")] == 1
    assert not [k for k in counts if k[1] == lines["d2h-cpu"]]
    assert {(r["line"], r["direction"]) for r in result["caught"]} >= {(lines["d2h"], "d2h"), (lines["loop"], "h2d")}


def test_program_stderr_and_stdout_pass_through(tiny):
    _, _, _, proc, _ = tiny
    err = proc.stderr
    assert b"user stderr line\n" in err
    assert b"partial... raw fd 2 \xff bytes\n" in err
    assert b"guard_lib" not in err  # every guard line was counted, none leaked
    assert proc.stdout.startswith(b"stdout ok 3.0\n")


def test_log_mode_agrees(tiny):
    path, _, result, _, counts = tiny
    assert oracle_counts(path, env=_env(), timeout=120, mode="log") == counts


EXITS = {
    "raises": """
        import sys
        import numpy as np
        import jax.numpy as jnp
        print("before")
        sys.stderr.write("to stderr\\n")
        x = jnp.sin(np.ones(3)) + undefined_name
    """,
    "exits": """
        import sys
        import numpy as np
        import jax.numpy as jnp
        def main():
            y = jnp.cos(np.ones(3))
            sys.exit(3)
        main()
    """,
}


@pytest.mark.parametrize("name", sorted(EXITS))
def test_exit_status_and_exception_unchanged(tmp_path, name):
    path, _ = _write(tmp_path, f"{name}.py", EXITS[name])
    plain = subprocess.run([sys.executable, str(path)], env=_env(), capture_output=True, timeout=120)
    result, proc = oracle_run(path, env=_env(), timeout=120)
    assert proc.returncode == plain.returncode == (1 if name == "raises" else 3)
    assert proc.stdout == plain.stdout
    assert proc.stderr == plain.stderr  # the same traceback, no "During handling" chain
    assert [(r["line"], r["direction"], r["count"]) for r in result["lines"]] == [(6 if name == "raises" else 5, "h2d", 1)]
    assert result["exception"] == ("NameError" if name == "raises" else "SystemExit")


def test_d2d_fast_path_and_modes(tmp_path):
    """JAX logs a d2d for a committed device-0 array fed to a jit pinned to
    device 1 only on the compiling call: later calls take jit's C++ fast path,
    which copies without the guard. The disallow attempt makes that first call
    fail, which switches the fast path off for the call signature: every call
    then logs (and really copies)."""
    path, lines = _write(
        tmp_path,
        "pinned.py",
        """
        import jax, numpy as np
        from jax.sharding import SingleDeviceSharding
        d = jax.devices()
        pinned = jax.jit(lambda a: a + 1, in_shardings=SingleDeviceSharding(d[1]))
        on0 = jax.device_put(np.arange(4.0), d[0])
        for i in range(5):
            y = pinned(on0)  # L:pinned
        """,
    )
    key = ("pinned.py", lines["pinned"], "d2d")
    assert oracle_counts(path, env=_env(), timeout=120) == {key: 5}
    assert oracle_counts(path, env=_env(), timeout=120, mode="log") == {key: 1}


# -- the transformation keeps the program's semantics (in this process, no JAX) --


class _NoGuard(transfer_oracle.Oracle):
    def _guard(self, level):
        return transfer_oracle._NULL


SEMANTICS = '''
"""module doc"""
from __future__ import annotations
import sys
counter = 0
def bump():
    """bump doc"""
    global counter
    counter += 1
    return counter
def outer():
    x = 1
    def inner():
        nonlocal x
        x += 10
    inner()
    return x
def gen(n):
    for i in range(n):
        if i == 2:
            continue
        got = yield i * 10
        if got == "stop":
            break
    else:
        yield "else"
    yield "end"
def loop():
    i = 0
    while i < 5:
        i += 1
        if i == 3:
            break
    else:
        return "no break"
    return i
class K:
    """class doc"""
    a: int = 3
    b = a + 1
    def m(self):
        return __class__.__name__ + str(self.b)
try:
    try:
        raise KeyError("k")
    except KeyError:
        raise
except KeyError as e:
    caught = repr(e)
g = gen(6)
seq = [next(g), next(g), g.send(None), g.send("stop")]
results = (bump(), bump(), outer(), loop(), K().m(), K.__doc__, bump.__doc__, __doc__, caught, seq, list(gen(2)))
'''


def test_transformation_keeps_semantics():
    path = "/nonexistent/semantics.py"
    plain = {}
    exec(compile(SEMANTICS, path, "exec"), plain)
    oracle = _NoGuard([path])
    saved = getattr(transfer_oracle.builtins, transfer_oracle.BUILTIN_NAME, None)
    setattr(transfer_oracle.builtins, transfer_oracle.BUILTIN_NAME, oracle)
    try:
        wrapped = {}
        exec(transfer_oracle.transform(SEMANTICS, path), wrapped)
    finally:
        if saved is None:
            delattr(transfer_oracle.builtins, transfer_oracle.BUILTIN_NAME)
        else:
            setattr(transfer_oracle.builtins, transfer_oracle.BUILTIN_NAME, saved)
    assert wrapped["results"] == plain["results"]
    assert wrapped["results"][2:4] == (11, 3)
    assert wrapped["K"].__annotations__ == {"a": "int"}
    assert "_jto_r" not in vars(wrapped["K"])  # class bodies are left alone
    assert oracle.result()["lines"] == [] and oracle.result()["caught"] == []


# -- the two target programs: the per-line tables jaxtop is compared with --

TARGETS = Path(__file__).parent / "targets"


def _line_of(path, text):
    found = [n for n, line in enumerate(path.read_text().splitlines(), 1) if line.strip() == text]
    assert len(found) == 1, (text, found)
    return found[0]


@pytest.mark.parametrize("mode", ["disallow", "log"])
def test_transfer_mixed_table(mode):
    path = TARGETS / "transfer_mixed.py"
    steps = 10
    result, proc = oracle_run(path, ["--steps", steps], env=_env(), timeout=120, mode=mode)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    line = lambda text: _line_of(path, text)  # noqa: E731
    counts = {(r["line"], r["direction"]): r["count"] for r in result["lines"]}
    assert counts == {
        (line('params, loss = train_step(params, {"x": xs[i], "y": ys[i]}, step, lr)'), "h2d"): 4 * steps,
        (line("feats = jnp.sin(noise[i])"), "h2d"): steps,
        # every call in disallow mode, only the compiling call in log mode (see the program)
        (line("moved = pinned(on_dev0)"), "d2d"): steps if mode == "disallow" else 1,
        (line("spread = sharded + offset"), "d2d"): 8 * steps,
        (line("codes = np.asarray(quantize(params))"), "d2h"): steps // 5,
    }
    assert result["disagreements"] == [] and result["unattributed"] == {}


def test_mnist_fromscratch_table():
    path = TARGETS / "mnist_fromscratch.py"
    result, proc = oracle_run(path, env=_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    assert proc.stdout.count(b"Test set accuracy") == 2
    line = lambda text: _line_of(path, text)  # noqa: E731
    counts = {(r["line"], r["direction"]): r["count"] for r in result["lines"]}
    epochs, batches, accuracy_calls = 2, 1024 // 128, 4
    assert counts == {
        # the first call also moves the 6 NumPy parameters; every call the batch's 2 arrays
        (line("params = update(params, next(batches))"), "h2d"): 6 + 2 * epochs * batches,
        # eager, from accuracy(): the NumPy inputs to the first layer, ...
        (line("outputs = jnp.dot(activations, w) + b"), "h2d"): accuracy_calls,
        # ... logsumexp's two scalar operands, and the NumPy targets
        (line("return logits - logsumexp(logits, axis=1, keepdims=True)"), "h2d"): 2 * accuracy_calls,
        (line("target_class = jnp.argmax(targets, axis=1)"), "h2d"): accuracy_calls,
    }
    assert result["disagreements"] == [] and result["unattributed"] == {}
