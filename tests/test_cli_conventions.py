"""The command line as users of nvitop, py-spy, memray and pytest expect it:
-V, completions, help for every command and argument, the environment and
examples in --help, a command's own usage on its mistakes, "did you mean",
``jaxtop run python x.py`` and ``-c CODE``, a one-shot snapshot, no
full-screen output into a pipe, and a non-zero exit with nothing to attach."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from conftest import PY
from jaxtop.cli import build_parser
from jaxtop.cli.exits import ENVIRONMENT_HELP
from jaxtop.wire.protocol import JAXTOP_VERSION

ROOT = Path(__file__).resolve().parent.parent


def jaxtop(*args, env=None, timeout=120, **kw):
    return subprocess.run([PY, "-m", "jaxtop", *map(str, args)], env=env, capture_output=True, text=True,
                          timeout=timeout, **kw)


@pytest.mark.parametrize("flag", ["-V", "--version"])
def test_version(flag):
    res = jaxtop(flag)
    assert res.returncode == 0 and res.stdout.strip() == f"jaxtop {JAXTOP_VERSION}"


def test_every_command_and_argument_is_described():
    parser = build_parser()
    for name, command in parser.commands.items():
        assert command.description or name == "oom", f"{name}: no description"
        for action in command._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            assert action.help, f"{name} {action.option_strings or action.dest}: no help"


def test_help_names_every_environment_variable_jaxtop_reads_and_has_examples():
    read = set()
    for folder in ("jaxtop", "probes"):
        for path in (ROOT / folder).rglob("*.py"):
            read |= set(re.findall(r"environ(?:\.get)?\(?\[?\s*\"(JAXTOP_[A-Z_]+)\"", path.read_text()))
    assert {"JAXTOP_SOCKET_DIR", "JAXTOP_SPOOL_MAX_BYTES", "JAXTOP_CACHE_DIR", "JAXTOP_JOB"} <= read
    listed = set(re.findall(r"JAXTOP_[A-Z_]+", ENVIRONMENT_HELP))
    assert read <= listed, read - listed
    out = jaxtop("--help").stdout
    assert "environment:" in out and "examples:" in out and "exit status:" in out
    assert "jaxtop run python train.py" in out or "jaxtop run train.py" in out


def test_a_mistake_in_a_command_shows_that_commands_usage_and_a_suggestion():
    res = jaxtop("export", "x.jsonl", "--format", "csv", "--ouput", "y.csv")
    assert res.returncode == 2
    assert res.stderr.startswith("usage: jaxtop export ")  # the command's usage, not the top level's
    assert "unrecognized arguments: --ouput y.csv" in res.stderr and "did you mean --output?" in res.stderr
    res = jaxtop("atach", "1")
    assert res.returncode == 2 and "did you mean 'attach'?" in res.stderr
    res = jaxtop("ls", "--jsn")
    assert res.returncode == 2 and res.stderr.startswith("usage: jaxtop ls") and "did you mean --json?" in res.stderr


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "show.py"
    path.write_text("import sys\nprint(repr(sys.argv), __name__, __file__ == sys.argv[0] or __file__)\n")
    return path


def test_run_python_script_runs_as_python_would(child_env, script, tmp_path):
    plain = subprocess.run([PY, str(script), "a", "--b"], capture_output=True, text=True, env=child_env, cwd=tmp_path)
    for python in ("python", "python3", PY):
        res = jaxtop("run", python, script, "a", "--b", env=child_env, cwd=tmp_path)
        assert res.returncode == 0, res.stderr
        assert res.stdout == plain.stdout, python


def test_run_c_code_runs_as_python_c(child_env, tmp_path):
    code = "import sys; print(sys.argv, __name__, '__file__' in globals())"
    plain = subprocess.run([PY, "-c", code, "x", "-y"], capture_output=True, text=True, env=child_env)
    for args in (("-c", code), ("python", "-c", code), ("python3", f"-c{code}")):
        res = jaxtop("run", *args, "x", "-y", env=child_env, cwd=tmp_path)
        assert res.returncode == 0, res.stderr
        assert res.stdout == plain.stdout == "['-c', 'x', '-y'] __main__ False\n", args


def test_run_python_m_module(child_env, tmp_path):
    res = jaxtop("run", "python3", "-m", "json.tool", input='{"b": 1}', env=child_env, cwd=tmp_path)
    assert res.returncode == 0 and json.loads(res.stdout) == {"b": 1}, res.stderr


def test_pythons_own_options_are_refused_with_what_to_do(child_env, script):
    # -u, -O, -W, -X... are passed on (test_cli_habits_run.py); -i, -E, -I
    # and -S would change what python does besides the program, or where it
    # finds jaxtop itself.
    res = jaxtop("run", "python", "-i", script, env=child_env)
    assert res.returncode == 2 and "python -i -m jaxtop run SCRIPT" in res.stderr


def test_bash_completion_completes_commands_options_and_pids(tmp_path):
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash")
    sockdir = tmp_path / "sock"
    sockdir.mkdir(mode=0o700)
    (sockdir / f"{os.getpid()}.sock").touch()  # a live pid with a socket: what `ls --pids` lists
    (sockdir / "999999999.sock").touch()  # a gone one: not offered
    script = jaxtop("completions", "bash").stdout
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "jaxtop").write_text(f"#!/bin/sh\nexec {PY} -m jaxtop \"$@\"\n")
    (bindir / "jaxtop").chmod(0o755)

    def complete(*words):
        line = " ".join(("jaxtop", *words))
        probe = (f"{script}\nCOMP_WORDS=({line}); COMP_CWORD={len(words)}; _jaxtop; "
                 'printf "%s\\n" "${COMPREPLY[@]}"')
        env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}", JAXTOP_SOCKET_DIR=str(sockdir))
        return subprocess.run([bash, "-c", probe], capture_output=True, text=True, env=env, timeout=60).stdout.split()

    assert complete("at") == ["attach"]
    assert complete("snap") == ["snapshot"]
    assert "--log" in complete("run", "--") and "--prometheus-push" in complete("run", "--")
    assert complete("attach", "") == [str(os.getpid())]
    assert complete("completions", "") == ["bash", "zsh", "fish"]


@pytest.mark.parametrize("shell", ["zsh", "fish"])
def test_zsh_and_fish_scripts_are_valid(shell):
    script = jaxtop("completions", shell).stdout
    assert "attach" in script and "snapshot" in script
    binary = shutil.which(shell)
    if binary is None:
        pytest.skip(f"{shell} is not installed here: the script's syntax is not checked")
    res = subprocess.run([binary, "-n"], input=script, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr


@pytest.mark.slow
def test_snapshot_prints_every_panels_figures_once(child_env, tmp_path):
    target = tmp_path / "hold.py"
    target.write_text(textwrap_dedent("""
        import sys, time
        import jaxtop
        jaxtop.instrument(interval_s=0.05, slow_interval_s=0.1)
        import jax, jax.numpy as jnp, numpy as np
        xs = [jnp.full((256, 256), i, jnp.float32) for i in range(8)]
        y = jnp.asarray(np.ones(4)) + 1
        jax.block_until_ready(xs)
        print(sum(x.nbytes for x in jax.live_arrays() if x.devices() == {jax.devices()[0]}), flush=True)
        time.sleep(60)
    """))
    proc = subprocess.Popen([PY, str(target)], env=child_env, stdout=subprocess.PIPE, text=True)
    try:
        held = int(proc.stdout.readline())
        time.sleep(1.0)  # a scan after the arrays were made
        res = jaxtop("snapshot", proc.pid, "--json", env=child_env)
        assert res.returncode == 0, res.stderr
        doc = json.loads(res.stdout)
        [process] = doc["processes"]
        assert process["pid"] == proc.pid and process["backend"] == "cpu" and process["state"] == "live"
        assert process["transfers"]["h2d"]["count_total"] >= 1
        assert process["process"]["rss_bytes"] > 0
        device = next(d for d in doc["devices"] if d["id"] == 0)
        assert device["bytes_in_use"] == device["live_bytes"] == held  # jax.live_arrays() is the oracle
        assert device["pool_bytes"] is None and device["fragmentation_reason"]  # n/a with the reason, not 0
        assert "timeline" not in device and "buffer_map" not in device
        text = jaxtop("snapshot", proc.pid, env=child_env)
        assert text.returncode == 0 and f"pid {proc.pid}" in text.stdout and "cpu:0" in text.stdout
        assert "fragmentation n/a (" in text.stdout
    finally:
        proc.kill()
        proc.wait()
    res = jaxtop("snapshot", proc.pid, env=child_env)
    assert res.returncode == 2 and "no process with pid" in res.stderr


def textwrap_dedent(text: str) -> str:
    import textwrap

    return textwrap.dedent(text)


def test_no_dashboard_into_a_pipe_and_nothing_to_attach_is_an_error(child_env, tmp_path):
    recording = tmp_path / "r.jsonl"
    recording.write_text('{"type":"hello","t":1,"pid":1}\n')
    res = jaxtop("replay", recording, env=child_env)
    assert res.returncode == 2 and "not a terminal" in res.stderr and "jaxtop export" in res.stderr
    res = jaxtop("attach", "--prometheus", "http://127.0.0.1:9", env=child_env)
    assert res.returncode == 2  # the server cannot be asked: a clear error, no screen
    res = jaxtop(env=child_env)  # no agent at all
    assert res.returncode == 2 and "No instrumented JAX processes" in res.stdout
    res = jaxtop("ls", "--pids", env=child_env)
    assert res.returncode == 0 and res.stdout == ""


@pytest.mark.slow
def test_the_budget_report_can_go_to_stdout(child_env, tmp_path):
    script = tmp_path / "t.py"
    script.write_text("import jax.numpy as jnp, numpy as np\nprint('program output')\nx = jnp.asarray(np.ones(3)) + 1\n")
    res = jaxtop("run", "--budget", "h2d=10", "--budget-report", "-", script, env=child_env)
    assert res.returncode == 0, res.stderr
    first, rest = res.stdout.split("\n", 1)
    assert first == "program output"
    report = json.loads(rest)
    assert report["ok"] is True and report["jaxtop_budget_report"]


def test_the_recording_names_the_program_not_jaxtops_options(child_env, script, tmp_path):
    log = tmp_path / "r.jsonl"
    res = jaxtop("run", "--log", log, "--interval", "0.05", script, "a", env=child_env, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    hello = json.loads(log.read_text().splitlines()[0])
    assert hello["type"] == "hello" and hello["argv"] == [str(script), "a"]


@pytest.mark.parametrize("command", [("oom",), ("advise",), ("export", "--format", "csv"), ("replay",)])
def test_a_missing_file_is_said_in_one_line_as_every_command_says_it(command, tmp_path):
    """`no such file: X` and exit 2, never Python's `[Errno 2] …` or a traceback."""
    missing = tmp_path / "nope.jsonl"
    done = subprocess.run([PY, "-m", "jaxtop", command[0], str(missing), *command[1:]],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    err = done.stderr.strip()
    assert "no such file" in err and str(missing) in err and "Errno" not in err and "Traceback" not in err, err
    assert len(err.splitlines()) == 1, err
