"""The agent's own commands on the socket: ``memory_profile`` and ``detach``
(``ping`` is answered inline; the probes serve theirs).

Standard library only (the agent imports it inside the user's job).
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Callable

from jaxtop.agent.clients import CommandError

__all__ = ["PROFILE_MIN_INTERVAL_S", "MemoryProfileCommand", "detach_command", "profile_directory"]

#: Least time between two memory profiles of this process, whoever asks:
#: taking one stalls the program for milliseconds and writes a file.
PROFILE_MIN_INTERVAL_S = 2.0


class MemoryProfileCommand:
    """Take a device memory profile and save it (command ``memory_profile``).

    Args:
        backend_ready: whether the program has a JAX backend yet (the
            profile never creates one).
    """

    def __init__(self, backend_ready: Callable[[], bool]) -> None:
        self._backend_ready = backend_ready
        self._next_t = 0.0  # monotonic

    def __call__(self, args: dict[str, Any]) -> dict[str, Any]:
        """Args:
            args: the command's arguments. ``directory`` (optional) is where
                the profile file goes: a string naming an existing directory
                by its absolute path. Anything else is refused: a non-string,
                a relative path (it would land in the program's working
                directory), a path that does not exist or is not a directory.
                The directory is never created. Without it: the directory in
                ``$JAXTOP_PROFILE_DIR`` (which must exist too), else
                jaxtop's own, ``$XDG_STATE_HOME/jaxtop/profiles`` (default
                ``~/.local/state/jaxtop/profiles``), made private (mode 0700)
                if missing and refused if it is not private; never the
                program's working directory.

        Returns:
            ``take_profile``'s result (``path``, ``total_bytes``,
            ``seconds``, ``top_sites``, ...) or ``{"error": ...}``. jaxtop
            keeps the newest ``MAX_PROFILE_FILES`` (20) files of its own
            naming in that directory and deletes older ones of that naming;
            it deletes nothing else.

        Raises:
            CommandError: a bad ``directory``; or a profile was taken less
                than :data:`PROFILE_MIN_INTERVAL_S` ago, by any client: the
                reply says "rate limited ... retry in X s" and carries
                ``retry_after_s``. A flood of requests costs the program one
                profile per interval, not one per request.
        """
        directory = profile_directory(args.get("directory"))
        if not self._backend_ready():
            return {"error": "the program has not started a JAX backend yet"}
        now = time.monotonic()
        if now < self._next_t:
            wait = self._next_t - now
            raise CommandError(
                f"rate limited: at most one memory profile every {PROFILE_MIN_INTERVAL_S:g} s; retry in {wait:.1f} s",
                retry_after_s=max(0.001, round(wait, 3)),
            )
        self._next_t = now + PROFILE_MIN_INTERVAL_S
        from jaxtop.probes.memory_profile import take_profile

        return take_profile(directory)


def detach_command(agent: Any) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """Command ``detach`` (``jaxtop detach PID``): stop ``agent`` on a thread
    of its own, so that the agent thread flushes the reply on its way out.

    Only the first request starts that thread: the ones that arrive while
    the agent is stopping get the same reply, with ``already: true``."""
    started = []  # the handler runs on the agent thread only: a plain flag, no lock

    def detach(args: dict[str, Any]) -> dict[str, Any]:
        if started:
            return {"detaching": True, "pid": agent.pid, "already": True}
        started.append(True)

        def stop() -> None:
            from jaxtop.agent.handle import current

            handle = current()
            if handle is not None and handle.agent is agent:
                handle.stop()
            else:
                agent.stop()

        threading.Thread(target=stop, name="jaxtop-detach", daemon=True).start()
        return {"detaching": True, "pid": agent.pid}

    return detach


def profile_directory(requested: Any) -> str:
    """Where ``memory_profile`` saves, checked (see :class:`MemoryProfileCommand`).

    Without a ``requested`` directory nor ``$JAXTOP_PROFILE_DIR``, jaxtop's
    own private directory: the working directory collected profiles in the
    user's project (``s`` pressed a few times, ``jaxtop demo --headless``)
    and, when shared, showed others which functions allocated what.

    Raises:
        CommandError: the directory is not acceptable.
    """
    if requested is None:
        env = os.environ.get("JAXTOP_PROFILE_DIR")
        if env:
            directory = os.path.abspath(env)
        else:
            from jaxtop.probes.memory_profile import ProfileDirError, private_profile_dir

            try:
                return private_profile_dir()
            except ProfileDirError as exc:
                raise CommandError(str(exc)) from None
    elif not isinstance(requested, str):
        raise CommandError(f"directory must be a string (an absolute path), not {type(requested).__name__}")
    elif not os.path.isabs(requested):
        raise CommandError(f"directory must be an absolute path, not {requested!r}")
    else:
        directory = requested
    if not os.path.exists(directory):
        raise CommandError(f"directory {directory!r} does not exist (the command never creates one)")
    if not os.path.isdir(directory):
        raise CommandError(f"{directory!r} is not a directory")
    return directory
