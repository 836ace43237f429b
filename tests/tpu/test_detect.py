"""How the chip tests decide whether a TPU is here: without starting
anything where libtpu is absent (CI), and with the reason in every skip."""

from __future__ import annotations

import subprocess

import pytest

from tpu import chip


def test_without_libtpu_nothing_is_started(monkeypatch):
    monkeypatch.delenv("JAX_PLATFORMS", raising=False)
    monkeypatch.setattr(chip.importlib.util, "find_spec", lambda name: None)

    def no_child(*args, **kwargs):
        raise AssertionError("a process was started to look for a TPU where libtpu is not installed")

    monkeypatch.setattr(chip.subprocess, "run", no_child)
    present, why = chip.tpu_status.__wrapped__()
    assert not present and why.startswith("no TPU here: libtpu is not installed")


def test_jax_platforms_without_tpu_is_the_reason(monkeypatch):
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    assert chip.tpu_status.__wrapped__() == (False, "JAX_PLATFORMS=cpu keeps jax off any TPU")


@pytest.mark.slow
@pytest.mark.skipif(chip.importlib.util.find_spec("libtpu") is not None,
                    reason="the real libtpu is installed here: the chip itself answers (tests/tpu's other tests)")
def test_a_libtpu_that_opens_no_chip_is_said(monkeypatch, tmp_path):
    # A machine with libtpu but no chip (or one jax cannot open): the probe
    # asks jax in a child process, which falls back to CPU, and says so.
    (tmp_path / "libtpu").mkdir()
    (tmp_path / "libtpu" / "__init__.py").write_text('"""not the real libtpu: no chip behind it"""\n')
    monkeypatch.delenv("JAX_PLATFORMS", raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    present, why = chip.tpu_status.__wrapped__()
    assert (present, why) == (False, "libtpu is installed but jax's devices are cpu, not tpu")


def test_a_probe_that_fails_gives_its_last_line(monkeypatch):
    monkeypatch.delenv("JAX_PLATFORMS", raising=False)
    monkeypatch.setattr(chip.importlib.util, "find_spec", lambda name: object())
    failed = subprocess.CompletedProcess([], 1, stdout="", stderr="Traceback ...\nRuntimeError: TPU is in use by pid 4242\n")
    monkeypatch.setattr(chip.subprocess, "run", lambda *a, **k: failed)
    present, why = chip.tpu_status.__wrapped__()
    assert not present and why.endswith("RuntimeError: TPU is in use by pid 4242")
