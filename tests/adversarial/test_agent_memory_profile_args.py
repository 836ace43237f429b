"""Adversarial: the ``memory_profile`` command's ``directory`` argument.

It is the one argument that names a place on disk. A non-string, a relative
path (which would land in the program's cwd) or a path that does not exist
(which the command would create) is refused before anything is touched.
"""

from __future__ import annotations

import os

import pytest

from jaxtop.agent import Agent


@pytest.fixture
def profile_command(monkeypatch, tmp_path):
    """The agent's ``memory_profile`` handler, with a backend and with
    ``take_profile`` replaced by a recorder that behaves like the real one
    (it creates the directory it is given)."""
    from jaxtop.probes import memory_profile

    calls = []

    def fake_take_profile(directory, *args, **kwargs):
        calls.append(str(directory))
        os.makedirs(directory, exist_ok=True)
        return {"path": os.path.join(directory, "x.prof"), "total_bytes": 0}

    monkeypatch.setattr(memory_profile, "take_profile", fake_take_profile)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("JAXTOP_PROFILE_DIR", raising=False)
    agent = Agent(capture_stderr=False, nvml=False)
    agent.devices.memory = object()  # as if the program had a JAX backend
    handler = agent._commands["memory_profile"]

    def call(args):
        """The error message the client would see, or the result."""
        try:
            result = handler(args)
        except Exception as exc:  # the agent answers ok: false with its message
            return str(exc)
        return result.get("error") or result

    yield call, calls
    for fd in (agent._wake_r, agent._wake_w):
        os.close(fd)


@pytest.mark.parametrize("directory", [5, ["/tmp"], {"a": 1}, True, 1.5])
def test_non_string_directory_is_refused(profile_command, directory):
    call, calls = profile_command
    message = call({"directory": directory})
    assert isinstance(message, str) and "directory" in message and "string" in message, message
    assert calls == []


@pytest.mark.parametrize("directory", ["relative", "sub/dir", ".", "", "../up"])
def test_relative_directory_is_refused_and_never_created(profile_command, tmp_path, directory):
    call, calls = profile_command
    before = sorted(os.listdir(tmp_path))
    message = call({"directory": directory})
    assert isinstance(message, str) and "absolute" in message, message
    assert calls == []
    assert sorted(os.listdir(tmp_path)) == before


def test_only_an_existing_absolute_directory_is_used(profile_command, tmp_path):
    call, calls = profile_command
    missing = tmp_path / "not" / "there"
    message = call({"directory": str(missing)})
    assert isinstance(message, str) and "does not exist" in message, message
    assert not (tmp_path / "not").exists()
    a_file = tmp_path / "file"
    a_file.write_text("x")
    message = call({"directory": str(a_file)})
    assert isinstance(message, str) and "not a directory" in message, message
    assert calls == []
    # An existing absolute directory is used as given.
    out = tmp_path / "profiles"
    out.mkdir()
    result = call({"directory": str(out)})
    assert isinstance(result, dict) and result["path"].startswith(str(out)), result
    assert calls == [str(out)]


def test_the_rules_are_in_the_commands_docstring():
    from jaxtop.agent.commands import MemoryProfileCommand

    doc = MemoryProfileCommand.__call__.__doc__
    for word in ("directory", "absolute", "exist", "never created"):
        assert word in doc, word
