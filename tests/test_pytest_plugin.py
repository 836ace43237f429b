"""The pytest plugin, in pytest sessions of their own (pytester, one process each)."""

from __future__ import annotations

import os
import re
import subprocess
import textwrap

import pytest

from conftest import NAMES_COMPILES

#: Sessions whose outcomes hang on a recompile limit being checked.
needs_compile_names = pytest.mark.skipif(
    not NAMES_COMPILES, reason="recompile limits need jax >= 0.6.2, which names the compiled function in its "
                               "compile events; before, they are n/a (tests/test_budget.py checks that)")

pytest_plugins = ["pytester"]


@pytest.fixture
def inner(pytester, sockdir, monkeypatch):
    """A pytester whose sessions run on CPU with a private socket directory."""
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    monkeypatch.delenv("JAX_TRANSFER_GUARD", raising=False)
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)
    return pytester


def run_inner(pytester, *args):
    # A subprocess: the session's agent lives in a process of its own, as in CI.
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rA", *args, timeout=240)


WORKLOAD = textwrap.dedent("""
    import numpy as np
    import pytest

    import jax
    import jax.numpy as jnp

    from jaxtop.agent.handle import current

    W = jax.device_put(np.full((64, 64), 0.01, np.float32))
    step = jax.jit(lambda w, x: jnp.tanh(x @ w).sum())
    PLACED = jax.device_put(np.ones((16, 64), np.float32))
    step(W, PLACED).block_until_ready()  # compiled at import: no test pays for it
    AGENTS = []


    def feed_numpy(n):
        for _ in range(n):
            step(W, np.ones((16, 64), np.float32)).block_until_ready()


    def seen_agent():
        handle = current()
        assert handle is not None and handle.running
        AGENTS.append(handle.agent)
""")


@pytest.mark.slow
@needs_compile_names
def test_marker_and_fixture_in_one_session(inner):
    inner.makepyprojecttoml("""
        [tool.jaxtop.budget]
        h2d = 0
    """)
    inner.makepyfile(test_steps=WORKLOAD + textwrap.dedent("""

        @pytest.mark.jaxtop_budget("h2d=0,recompiles=0")
        def test_within_budget():
            seen_agent()
            for _ in range(5):
                step(W, PLACED).block_until_ready()


        @pytest.mark.jaxtop_budget("h2d=0")
        def test_numpy_feed():
            seen_agent()
            feed_numpy(4)


        @pytest.mark.jaxtop_budget("recompiles=0")
        def test_recompiles():
            f = jax.jit(lambda x: x * 2)
            for n in (3, 4, 5):
                f(jax.device_put(np.ones(n, np.float32))).block_until_ready()


        # Back to back with one agent: each test's count is its own.
        @pytest.mark.jaxtop_budget("h2d=5")
        def test_exact_a():
            seen_agent()
            feed_numpy(5)


        @pytest.mark.jaxtop_budget("h2d=0")
        def test_exact_b():
            seen_agent()
            step(W, PLACED).block_until_ready()


        @pytest.mark.jaxtop_budget(h2d=2)
        def test_exact_c():
            seen_agent()
            feed_numpy(3)


        @pytest.mark.jaxtop_budget()
        def test_pyproject_budget():
            feed_numpy(1)


        @pytest.mark.jaxtop_budget("h2d=1MiB")
        def test_bad_spec():
            pass


        def test_fixture(jaxtop_budget):
            seen_agent()
            with jaxtop_budget.measure() as used:
                feed_numpy(3)
            assert used["h2d"] == 3 and used["compiles"] == 0
            with jaxtop_budget("h2d=0,compiles=0"):
                step(W, PLACED).block_until_ready()
            with pytest.raises(AssertionError, match=r"h2d +2 > 1"):
                with jaxtop_budget("h2d=1"):
                    feed_numpy(2)


        def test_one_agent_and_gone_after_the_last_budget():
            assert len({id(a) for a in AGENTS}) == 1, AGENTS
            assert current() is None  # stopped after the last test with a budget
            assert jax.config.jax_transfer_guard_host_to_device is None  # the guard put back
    """))
    result = run_inner(inner)
    out = result.stdout.str()
    result.assert_outcomes(passed=5, failed=4, errors=1)
    assert re.search(r"PASSED test_steps.py::test_within_budget", out)

    # NumPy batches: the report names h2d, the count and the shape.
    numpy_fail = section(out, "test_numpy_feed")
    assert "jaxtop_budget exceeded: h2d (test_steps.py::test_numpy_feed" in numpy_fail
    assert re.search(r"h2d +4 > 0  implicit host-to-device transfers", numpy_fail)
    assert "float32[16,64] x1" in numpy_fail and "(cached call, shape not logged) x3" in numpy_fail

    recompile_fail = section(out, "test_recompiles")
    assert re.search(r"recompiles +2 > 0", recompile_fail)
    assert re.search(r"jit\(<lambda>\) at test_steps.py:\d+ \(test_recompiles\): compiled 3 times", recompile_fail)

    # Exact per test: a's five do not leak into b, c counts its own three.
    assert "PASSED test_steps.py::test_exact_a" in out
    assert "PASSED test_steps.py::test_exact_b" in out
    assert re.search(r"h2d +3 > 2", section(out, "test_exact_c"))

    assert re.search(r"h2d +1 > 0", section(out, "test_pyproject_budget"))
    assert "pyproject.toml [tool.jaxtop.budget]" in section(out, "test_pyproject_budget")
    assert "jaxtop_budget marker: h2d=1MiB: h2d counts implicit host-to-device transfers" in out
    assert "PASSED test_steps.py::test_fixture" in out
    assert "PASSED test_steps.py::test_one_agent_and_gone_after_the_last_budget" in out
    # The guard's lines never reach the captured output.
    assert "transfer:" not in out


def section(out: str, test: str) -> str:
    """The failure section of one test in pytest's output."""
    match = re.search(rf"_{{3,}} {test} _{{3,}}\n(.*?)(?=\n_{{3,}} |\n={{3,}} )", out, re.S)
    assert match, f"no failure section for {test}:\n{out[-3000:]}"
    return match.group(1)


#: How a session loads the plugin: through jaxtop's pytest11 entry point, or
#: by the module's own name (what the entry point is to name).
LOADS = {
    "entry-point": ("jaxtop", ()),
    "module": ("jaxtop.budgets.pytest_plugin", ("-p", "no:jaxtop", "-p", "jaxtop.budgets.pytest_plugin")),
}


@pytest.mark.slow
@pytest.mark.parametrize("load", sorted(LOADS))
def test_a_test_that_fails_on_its_own_keeps_its_failure(inner, load):
    inner.makepyfile(test_own=WORKLOAD + textwrap.dedent("""

        @pytest.mark.jaxtop_budget("h2d=0")
        def test_fails_and_transfers():
            import os
            os.write(2, b"the test's own line on fd 2\\n")
            feed_numpy(2)
            assert False, "its own failure"
    """))
    result = run_inner(inner, *LOADS[load][1])
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "AssertionError: its own failure" in out
    assert "Captured jaxtop budget call" in out and re.search(r"h2d +2 > 0", out)
    # The test's own stderr still reaches pytest's capture, through the relay.
    assert "the test's own line on fd 2" in section(out, "test_fails_and_transfers")


@pytest.mark.parametrize("load", sorted(LOADS))
def test_the_plugin_stays_off_in_a_session_that_does_not_use_it(inner, load):
    name, args = LOADS[load]
    inner.makepyfile(test_plain="""
        import os
        import sys
        import threading


        def test_nothing_started(request, capfd):
            assert request.config.pluginmanager.hasplugin(PLUGIN)
            from jaxtop.agent.handle import current

            assert current() is None
            assert "jax" not in sys.modules  # the plugin imports no jax
            # Of its package, only the plugin itself is loaded.
            loaded = sorted(m for m in sys.modules if m.startswith("jaxtop.budgets."))
            assert loaded == ["jaxtop.budgets.pytest_plugin"], loaded
            assert not [t for t in threading.enumerate() if t.name.startswith("jaxtop")]
            os.write(2, b"plain fd 2\\n")
            assert capfd.readouterr().err == "plain fd 2\\n"  # fd 2 is pytest's
    """.replace("PLUGIN", repr(name)))
    result = run_inner(inner, *args)
    result.assert_outcomes(passed=1)
    markers = inner.runpytest_subprocess(*args, "--markers", timeout=120)
    assert "@pytest.mark.jaxtop_budget(spec=None, **limits)" in markers.stdout.str()


@pytest.mark.slow
@needs_compile_names
def test_the_command_line_budget_covers_every_test_and_the_summary_ranks_them(inner):
    inner.makepyfile(test_cli=WORKLOAD + textwrap.dedent("""

        def test_transfers_three():
            feed_numpy(3)


        def test_clean():
            step(W, PLACED).block_until_ready()


        @pytest.mark.jaxtop_budget("h2d=5")
        def test_own_marker_wins():
            feed_numpy(2)


        def test_recompiles():
            double = jax.jit(lambda x: x * 2)
            for shape in ((4096,), (32, 128), (128, 32)):  # a new shape each call: compiled three times
                double(W.reshape(shape)).block_until_ready()
    """))
    result = run_inner(inner, "--jaxtop-budget", "h2d=0,recompiles=1,peak=1GiB", "--jaxtop-summary", "2")
    result.assert_outcomes(passed=2, failed=2)
    out = result.stdout.str()
    assert re.search(r"FAILED test_cli.py::test_transfers_three - Failed: jaxtop_budget exceeded: h2", out), out
    assert re.search(r"FAILED test_cli.py::test_recompiles - Failed: jaxtop_budget exceeded: recompi", out), out
    summary = out.split("jaxtop budget summary", 1)[1]
    h2d = summary.split("h2d:", 1)[1].split("recompiles:", 1)[0]
    # The worst two by implicit transfers, largest first, each with the line
    # that made most of them; a test with none is not listed.
    assert re.search(r"^\s+3\s+test_cli.py::test_transfers_three  \(most at test_cli.py:\d+ \([^)]*\) x3\)\n"
                     r"\s+2\s+test_cli.py::test_own_marker_wins  \(most at test_cli.py:\d+ \([^)]*\) x2\)\s*$",
                     h2d.split("\n", 1)[1], re.M), h2d
    assert "test_cli.py::test_recompiles" in summary.split("recompiles:", 1)[1].split("peak:", 1)[0]
    assert "peak: the worst" in summary
    # A metric no budget checks is not measured, which the summary says
    # instead of "none" (that read as zero where JAX logged transfers).
    only_peak = run_inner(inner, "--jaxtop-budget", "peak=8GiB").stdout.str().split("jaxtop budget summary", 1)[1]
    assert "recompiles: not measured (no budget checks it" in only_peak
    assert "h2d: the worst 1 of 1 tests that measured it" in only_peak  # the one test whose own marker checks it
    assert "none in" not in only_peak
    quiet = run_inner(inner, "--jaxtop-budget", "h2d=100", "--jaxtop-summary", "0")
    assert "jaxtop budget summary" not in quiet.stdout.str()


def test_a_bad_command_line_budget_is_a_usage_error(inner):
    inner.makepyfile(test_x="def test_x():\n    pass\n")
    result = run_inner(inner, "--jaxtop-budget", "h2d=lots")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "--jaxtop-budget:" in result.stderr.str() and "h2d" in result.stderr.str()


@pytest.mark.slow
def test_a_budget_failure_points_at_the_test_not_at_the_plugin(inner):
    inner.makepyfile(test_tb=WORKLOAD + textwrap.dedent("""

        def test_block(jaxtop_budget):
            with jaxtop_budget("h2d=0"):
                feed_numpy(1)
    """))
    result = run_inner(inner)
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert 'with jaxtop_budget("h2d=0"):' in out
    assert "pytest_plugin.py" not in out and "def __exit__" not in out, out


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_jaxtop_run_pytest_from_a_wheel_prints_no_rewrite_warning(tmp_path):
    """Installed from a wheel (not editable), pytest marks the jaxtop package
    for assert rewriting because it ships a plugin, and under `jaxtop run -m
    pytest` jaxtop is already imported: "PytestAssertRewriteWarning: Module
    already imported so cannot be rewritten; jaxtop" on every run, before the
    package's docstring said PYTEST_DONT_REWRITE."""
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    wheels, venv = tmp_path / "wheels", tmp_path / "venv"
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", str(root), "-w", str(wheels)],
                           capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-2000:]
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    (wheel,) = wheels.glob("jaxtop-*.whl")
    installed = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", str(wheel), "pytest"],
                               capture_output=True, text=True, timeout=400)
    if installed.returncode != 0:
        pytest.skip(f"cannot install the wheel's dependencies here: {installed.stderr.strip()[-300:]}")
    (tmp_path / "test_one.py").write_text("def test_one():\n    assert 1 + 1 == 2\n")
    env = dict(os.environ, JAXTOP_SOCKET_DIR=str(tmp_path / "sock"), JAX_PLATFORMS="cpu")
    run = subprocess.run([str(venv / "bin" / "jaxtop"), "run", "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "test_one.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "1 passed" in run.stdout
    assert "PytestAssertRewriteWarning" not in run.stdout + run.stderr
