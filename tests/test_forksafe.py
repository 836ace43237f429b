"""Pure layer (with a real fork): every lock jaxtop adds to the user's
process is new and free in a forked child."""

from __future__ import annotations

import re
import threading
from pathlib import Path

import pytest

from jaxtop.probes.forksafe import ForkLock
from test_host_sync_numpy import _fork_while_held  # fork while another thread holds a lock

ROOT = Path(__file__).resolve().parent.parent

#: Locks no thread of the program takes (the agent's thread, the dashboard,
#: the client side), or renewed by their own fork handler.
RENEWED_OR_AGENT_ONLY = {
    "jaxtop/agent/agent.py",  # Agent._lock: the agent's thread; a child's agent is inert
    "jaxtop/wire/client.py",  # the dashboard's side of the socket
    "probes/nvml.py",  # the agent's and the NVML poll thread's
    "probes/jax_memory.py",  # _renew_lock_in_child
    "probes/host_sync.py",  # its own fork handler
    "probes/executables.py",  # _after_fork_in_child
    "probes/compile_events.py",  # its own fork handler
    "probes/forksafe.py",
}


@pytest.mark.parametrize("reentrant", [False, True])
def test_a_lock_held_by_another_thread_is_free_in_the_child(reentrant):
    lock = ForkLock(reentrant=reentrant)
    assert _fork_while_held(lock, lambda: lock.acquire()) == 0
    # A plain lock the same way: the child waits until the alarm ends it
    # (what jaxtop's locks did).
    plain = threading.Lock()
    assert _fork_while_held(plain, lambda: plain.acquire()) != 0
    assert lock.acquire(timeout=1) and (lock.release() is None)


def test_every_in_process_lock_is_renewed_after_fork():
    """No plain threading lock in the code that runs inside the user's
    process, apart from the ones listed with the reason no program thread
    takes them (or that renew themselves)."""
    found = []
    for base in ("probes", "jaxtop/agent", "jaxtop/budgets"):
        for path in sorted((ROOT / base).rglob("*.py")):
            rel = str(path.relative_to(ROOT))
            if rel in RENEWED_OR_AGENT_ONLY:
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if re.search(r"threading\.(R?Lock)\(\)", line) and not line.lstrip().startswith("#"):
                    found.append(f"{rel}:{n}: {line.strip()}")
    assert found == [], "use jaxtop.probes.forksafe.ForkLock:\n" + "\n".join(found)
