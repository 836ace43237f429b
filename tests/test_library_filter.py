"""Which files are the user's code (probes/frames.py's LibraryFilter)."""

from __future__ import annotations


def test_the_demo_is_the_users_code_installed_or_not(monkeypatch):
    """Installed, jaxtop's demo sits in site-packages under jaxtop (core
    code); it plays the user's program, so its lines are the user's (the
    advice named `<string>:1` for the installed demo's `loss`)."""
    from jaxtop.probes import frames

    installed = "/venv/lib/python3.11/site-packages/jaxtop/demo/"
    monkeypatch.setattr(frames, "_demo_dirs", lambda: (installed,))
    filt = frames.LibraryFilter()
    assert not filt.is_library(installed + "strategies.py")
    assert filt.is_library("/venv/lib/python3.11/site-packages/jaxtop/agent/agent.py")
