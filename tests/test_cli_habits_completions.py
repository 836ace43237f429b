"""Tab completion as users of other CLIs expect it: ``--format`` offers the
formats, ``serve`` offers ``replay``/``attach`` and then files or pids, and a
file name completes as one quoted word that never runs.

bash is driven as ``complete`` would drive it (``COMP_WORDS``, ``COMP_CWORD``
and the generated ``_jaxtop``) and, where it can be, as a user types: an
interactive bash or zsh in a pseudo-terminal, TAB, then Enter, with a
``jaxtop`` stub on PATH that records the arguments it was run with. fish is
asked with ``complete -C``.
"""

from __future__ import annotations

import os
import pty
import select
import shlex
import shutil
import subprocess
import time

import pytest

from conftest import PY

FORMATS = ["csv", "perfetto", "holders-csv", "labels-csv", "host-syncs-csv", "transfer-sites-csv"]
#: File names that run commands or split when a completion inserts them bare.
HOSTILE = ["n;id>PWNED;.jsonl", "s p a c e.jsonl", "d$(touch PWNED2).jsonl", "b`touch PWNED3`.jsonl"]


def script(shell):
    return subprocess.run([PY, "-m", "jaxtop", "completions", shell], capture_output=True, text=True,
                          check=True, timeout=120).stdout


@pytest.fixture
def workdir(tmp_path):
    """A directory holding the hostile names and one plain recording; a
    socket directory listing this process as a live agent; a ``jaxtop`` stub
    on PATH that answers ``ls --pids`` as jaxtop does and records any other
    command line in ``argv.bin`` (NUL-separated)."""
    work = tmp_path / "work"
    work.mkdir()
    for name in HOSTILE + ["plain.jsonl"]:
        (work / name).write_text("{}\n")
    sockdir = tmp_path / "sock"
    sockdir.mkdir(mode=0o700)
    (sockdir / f"{os.getpid()}.sock").touch()
    bindir = tmp_path / "bin"
    bindir.mkdir()
    stub = bindir / "jaxtop"
    stub.write_text(f'#!/bin/sh\nif [ "$1" = ls ]; then exec {PY} -m jaxtop "$@"; fi\n'
                    f'printf "%s\\0" "$@" > {shlex.quote(str(tmp_path / "argv.bin"))}\n')
    stub.chmod(0o755)
    env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}", JAXTOP_SOCKET_DIR=str(sockdir),
               HOME=str(tmp_path), TERM="dumb")
    return work, env, tmp_path


def no_side_effects(work):
    return not [p.name for p in work.iterdir() if p.name.startswith("PWNED")] and not (work / "PWNED").exists()


# -- bash, driven as `complete -F _jaxtop` drives it ---------------------------------------------------

BASH = shutil.which("bash")
needs_bash = pytest.mark.skipif(BASH is None, reason="no bash here")


def bash_complete(words, work, env, then=""):
    """COMPREPLY for the command line ``jaxtop WORDS`` (the last word is the
    one completed), then ``then`` (bash run after it, same shell)."""
    line = " ".join(shlex.quote(w) for w in ["jaxtop", *words])
    then = then or 'printf "%s\\0" "${COMPREPLY[@]}"'
    probe = (f"{script('bash')}\ncomplete -p jaxtop >/dev/null || exit 9\n"
             f"COMP_WORDS=({line}); COMP_CWORD={len(words)}; _jaxtop\n{then}")
    res = subprocess.run([BASH, "--norc", "-c", probe], cwd=work, env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return [w for w in res.stdout.split("\0") if w]


@needs_bash
def test_bash_format_completes_the_format_names(workdir):
    work, env, _ = workdir
    assert bash_complete(["export", "plain.jsonl", "--format", ""], work, env) == FORMATS
    assert bash_complete(["export", "plain.jsonl", "--format", "h"], work, env) == ["holders-csv", "host-syncs-csv"]
    # --format=VALUE: bash's COMP_WORDBREAKS splits it at the '='; zsh hands one word.
    assert bash_complete(["export", "plain.jsonl", "--format", "=", "p"], work, env) == ["perfetto"]
    assert bash_complete(["export", "plain.jsonl", "--format=l"], work, env) == ["--format=labels-csv"]
    # The file after it is still a file; an option still an option.
    assert bash_complete(["export", "--format", "csv", "pl"], work, env) == ["plain.jsonl"]
    assert "--with-jax-profile" in bash_complete(["export", "plain.jsonl", "--w"], work, env)


@needs_bash
def test_bash_serve_completes_replay_or_attach_then_files_or_pids(workdir):
    work, env, _ = workdir
    assert bash_complete(["serve", ""], work, env) == ["replay", "attach"]
    assert bash_complete(["serve", "--port", "8001", "r"], work, env) == ["replay"]
    assert bash_complete(["serve", "replay", "pl"], work, env) == ["plain.jsonl"]
    assert bash_complete(["serve", "attach", ""], work, env) == [str(os.getpid())]
    assert bash_complete(["serve", "attach", "--host", "0.0.0.0", ""], work, env) == [str(os.getpid())]


@needs_bash
@pytest.mark.parametrize("name", HOSTILE)
def test_bash_completes_a_hostile_file_name_as_one_quoted_word_that_never_runs(workdir, name):
    work, env, _ = workdir
    # What the shell reads back from the completed word, as it would on Enter.
    read_back = 'eval "set -- ${COMPREPLY[0]}"; printf "%s\\0" "${#COMPREPLY[@]}" "$#" "$@"'
    got = bash_complete(["replay", name[:1]], work, env, then=read_back)
    assert got == ["1", "1", name], got
    got = bash_complete(["export", "--format", "csv", name[:1]], work, env, then=read_back)
    assert got == ["1", "1", name], got
    assert no_side_effects(work)


# -- interactive shells in a pseudo-terminal ---------------------------------------------------------

def type_into(argv, setup, typed, work, env, done, timeout=60.0):
    """Run the interactive shell ``argv`` in a pty: each line of ``setup``,
    then ``typed`` (TABs included) and Enter, then ``exit``; returns what
    the terminal showed once ``done()`` holds (or time is up)."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: the shell
        os.chdir(work)
        os.execvpe(argv[0], argv, env)
    shown = b""

    def read(seconds):
        nonlocal shown
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if select.select([fd], [], [], 0.1)[0]:
                try:
                    shown += os.read(fd, 65536)
                except OSError:
                    return

    try:
        for line in setup:
            os.write(fd, line.encode() + b"\n")
            read(0.2)
        read(1.0)  # compinit, the script
        os.write(fd, typed.encode())
        read(1.0)  # the completion runs
        os.write(fd, b"\n")
        deadline = time.monotonic() + timeout
        while not done() and time.monotonic() < deadline:
            read(0.2)
        os.write(fd, b"exit\n")
        read(0.5)
    finally:
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
        os.waitpid(pid, 0)
        os.close(fd)
    return shown.decode(errors="replace")


def recorded(tmp_path):
    path = tmp_path / "argv.bin"
    return path.read_bytes().decode().split("\0")[:-1] if path.exists() else None


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_tab_then_enter_runs_jaxtop_with_the_file_name_as_one_argument(workdir, shell):
    binary = shutil.which(shell)
    if binary is None:
        pytest.skip(f"no {shell} here")
    work, env, tmp_path = workdir
    completion = tmp_path / f"completion.{shell}"
    completion.write_text(script(shell))
    argv = [binary, "--norc", "--noprofile", "-i"] if shell == "bash" else [binary, "-f", "-i"]
    setup = ["PS1='$ '", f"source {shlex.quote(str(completion))}"]
    if shell == "zsh":
        setup.insert(1, "unsetopt BEEP")
    for name in HOSTILE:
        (tmp_path / "argv.bin").unlink(missing_ok=True)
        shown = type_into(argv, setup, f"jaxtop replay {name[:1]}\t", work, env, lambda: recorded(tmp_path))
        assert recorded(tmp_path) == ["replay", name], (name, shown[-1500:])
    (tmp_path / "argv.bin").unlink(missing_ok=True)
    type_into(argv, setup, "jaxtop export plain.jsonl --format hol\t", work, env, lambda: recorded(tmp_path))
    assert recorded(tmp_path) == ["export", "plain.jsonl", "--format", "holders-csv"]
    (tmp_path / "argv.bin").unlink(missing_ok=True)
    type_into(argv, setup, "jaxtop serve r\tpl\t", work, env, lambda: recorded(tmp_path))
    assert recorded(tmp_path) == ["serve", "replay", "plain.jsonl"]
    assert no_side_effects(work)


# -- fish -------------------------------------------------------------------------------------------------

def test_fish_format_serve_and_files(workdir):
    fish = shutil.which("fish")
    if fish is None:
        pytest.skip("no fish here")
    work, env, tmp_path = workdir
    completion = tmp_path / "jaxtop.fish"
    completion.write_text(script("fish"))

    def complete(line):
        res = subprocess.run([fish, "--no-config", "-c", f"source {shlex.quote(str(completion))}; complete -C {shlex.quote(line)}"],
                             cwd=work, env=env, capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        return [row.split("\t")[0] for row in res.stdout.splitlines()]

    assert complete("jaxtop export plain.jsonl --format ") == sorted(FORMATS)  # fish sorts them
    assert complete("jaxtop serve ") == ["attach", "replay"]
    assert set(complete("jaxtop serve replay ")) >= set(HOSTILE)
    assert complete("jaxtop serve attach ") == [str(os.getpid())]
    assert set(complete("jaxtop replay ")) >= {"plain.jsonl", *HOSTILE}
    assert no_side_effects(work)
