"""Queueing the bootstrap in a target through ``sys.remote_exec`` (Python
>= 3.14 on both sides): the file runs in the target's main thread at its
next eval-loop check."""

from __future__ import annotations

import sys

from jaxtop.inject.target import InjectError, Target, ptrace_denied


def remote_exec(target: Target, boot: str) -> None:
    """Have ``target`` run the file ``boot`` at its next eval-loop check.

    Raises:
        InjectError: the call was refused or failed; the message says why.
    """
    try:
        sys.remote_exec(target.pid, boot)  # type: ignore[attr-defined]
    except PermissionError:
        raise InjectError(ptrace_denied(target.pid)) from None
    except ProcessLookupError:
        raise InjectError(f"process {target.pid} exited during injection") from None
    except RuntimeError as exc:
        if "disabled" in str(exc).lower():
            raise InjectError(
                f"remote debugging is disabled in process {target.pid} (PYTHON_DISABLE_REMOTE_DEBUG or "
                "-X disable_remote_debug); restart it with `jaxtop run`"
            ) from None
        raise InjectError(f"sys.remote_exec failed: {exc}") from None
