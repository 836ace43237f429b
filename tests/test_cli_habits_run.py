"""``jaxtop run python -u x.py`` and ``jaxtop run -`` (the script on stdin)
behave as ``python -u x.py`` and ``python -``: same ``sys.argv``,
``__main__``, flags, output, exit status and traceback, with the agent
running in the same process. Each case runs plain python and jaxtop side by
side as real processes.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import time

import pytest

from conftest import PY

SHOW = """\
import sys
print(sys.argv, repr(sys.path[0]), __name__, sorted(globals()), getattr(__loader__, '__name__', type(__loader__).__name__),
      repr(globals().get('__file__')))
print(sys.flags.optimize, sys.flags.dev_mode, sys.flags.bytes_warning, sys.flags.dont_write_bytecode, sys.warnoptions,
      __debug__, type(sys.stdout.buffer).__name__, sys.stdout.line_buffering)
"""

RAISES = """\
def inner():
    return 1 / 0
print("before", flush=True)
inner()
"""


@pytest.fixture
def env(child_env):
    """No PYTHONUNBUFFERED (this machine sets it): -u must make the difference."""
    out = dict(child_env)
    out.pop("PYTHONUNBUFFERED", None)
    out.pop("PYTHONDONTWRITEBYTECODE", None)
    return out


def both(python_args, tmp_path, env, stdin=None):
    """(plain, under jaxtop): ``python ARGS`` and ``python -m jaxtop run python ARGS``."""
    runs = []
    for cmd in ([PY, *python_args], [PY, "-m", "jaxtop", "run", "python", *python_args]):
        runs.append(subprocess.run(cmd, cwd=tmp_path, env=env, input=stdin, capture_output=True, timeout=120))
    return runs


@pytest.mark.parametrize("options", [
    ["-u"],
    ["-u", "-B", "-O"],
    ["-uBO"],
    ["-X", "dev", "-W", "error::DeprecationWarning"],
    ["-Xdev", "-Wd", "-bb", "-OO"],
])
def test_python_options_apply_to_the_program_as_python_applies_them(options, tmp_path, env):
    script = tmp_path / "show.py"
    script.write_text(SHOW)
    plain, ours = both([*options, "show.py", "a", "--b"], tmp_path, env)
    assert plain.returncode == ours.returncode == 0, ours.stderr.decode()
    assert ours.stdout == plain.stdout
    assert ours.stderr == plain.stderr


def test_u_is_unbuffered_output_that_arrives_while_the_program_waits(tmp_path, env):
    # The program prints without flushing, then blocks on stdin: only an
    # unbuffered stdout lets the line out before the program ends.
    script = tmp_path / "waits.py"
    script.write_text("import sys\nprint('ready')\nsys.stdin.readline()\nprint('done')\n")
    proc = subprocess.Popen([PY, "-m", "jaxtop", "run", "python", "-u", str(script)], cwd=tmp_path, env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline, seen = time.monotonic() + 60, b""
        while b"ready\n" not in seen and time.monotonic() < deadline and proc.poll() is None:
            if select.select([proc.stdout], [], [], 0.2)[0]:
                seen += os.read(proc.stdout.fileno(), 1024)
        assert seen == b"ready\n", (seen, proc.poll())
        out, err = proc.communicate(b"\n", timeout=60)
        assert (proc.returncode, out) == (0, b"done\n"), err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


@pytest.mark.parametrize("via_python", [False, True])
def test_a_script_on_stdin_runs_as_python_dash(via_python, tmp_path, env):
    plain = subprocess.run([PY, "-", "x", "-y"], cwd=tmp_path, env=env, input=SHOW.encode(), capture_output=True,
                           timeout=120)
    cmd = [PY, "-m", "jaxtop", "run", *(["python"] if via_python else []), "-", "x", "-y"]
    ours = subprocess.run(cmd, cwd=tmp_path, env=env, input=SHOW.encode(), capture_output=True, timeout=120)
    assert plain.returncode == ours.returncode == 0, ours.stderr.decode()
    assert ours.stdout == plain.stdout
    assert b"['-', 'x', '-y'] '' __main__" in ours.stdout and b"'<stdin>'" in ours.stdout


def test_a_failing_script_on_stdin_has_pythons_traceback_and_status(tmp_path, env):
    for program in (RAISES, "import sys\nprint('bye')\nsys.exit(7)\n"):
        plain = subprocess.run([PY, "-"], cwd=tmp_path, env=env, input=program.encode(), capture_output=True,
                               timeout=120)
        ours = subprocess.run([PY, "-m", "jaxtop", "run", "-"], cwd=tmp_path, env=env, input=program.encode(),
                              capture_output=True, timeout=120)
        assert (ours.returncode, ours.stdout, ours.stderr) == (plain.returncode, plain.stdout, plain.stderr)
        assert plain.returncode in (1, 7)


def test_python_options_with_a_failing_program_keep_its_traceback(tmp_path, env):
    (tmp_path / "raises.py").write_text(RAISES)
    plain, ours = both(["-u", "-X", "dev", "raises.py"], tmp_path, env)
    assert plain.returncode == ours.returncode == 1
    assert (ours.stdout, ours.stderr) == (plain.stdout, plain.stderr)


def test_the_agent_runs_in_the_same_process_and_names_the_program(tmp_path, env):
    (tmp_path / "show.py").write_text(SHOW)
    log = tmp_path / "run.jsonl"
    proc = subprocess.run([PY, "-m", "jaxtop", "run", "--log", str(log), "python", "-u", "-W", "ignore", "show.py",
                           "a"], cwd=tmp_path, env=env, capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()
    hello = json.loads(log.read_text().splitlines()[0])
    assert hello["type"] == "hello" and hello["argv"] == ["show.py", "a"]
    # `jaxtop run -` with jaxtop's own options before it.
    log.unlink()
    proc = subprocess.run([PY, "-m", "jaxtop", "run", "--log", str(log), "-", "z"], cwd=tmp_path, env=env,
                          input=SHOW.encode(), capture_output=True, timeout=120)
    assert proc.returncode == 0 and b"['-', 'z']" in proc.stdout, proc.stderr.decode()
    assert json.loads(log.read_text().splitlines()[0])["argv"] == ["-", "z"]


@pytest.mark.parametrize("option", ["-i", "-E", "-I", "-S", "-s", "-x", "--help", "-V"])
def test_options_that_change_what_python_does_besides_the_program_are_refused(option, tmp_path, env):
    (tmp_path / "show.py").write_text(SHOW)
    res = subprocess.run([PY, "-m", "jaxtop", "run", "python", option, "show.py"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and f"python {option} -m jaxtop run SCRIPT" in res.stderr, res.stderr
