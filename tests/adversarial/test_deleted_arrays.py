"""Arrays the program deletes while the agent looks at them.

jaxlib's ``Array.is_ready()`` on an array freed by ``Array.delete()``
dereferences a null pointer (a segfault, on every jaxlib tried). The agent
scans ``jax.live_arrays()`` from its own thread, so a program that frees its
buffers with ``delete()`` would be killed by the monitor. Each case runs in a
child process: the failure being guarded against is a crash.
"""

from __future__ import annotations

import os
import subprocess
import textwrap

from conftest import PY

RACE = textwrap.dedent("""
    import sys, threading, time
    import jax, jax.numpy as jnp
    from jaxtop.probes.jax_memory import JaxMemoryProbe, addresses_askable
    probe = JaxMemoryProbe()
    stop = False
    scans = 0
    mapped = 0
    def scanner():
        global scans, mapped
        while not stop:
            probe.scan_live_arrays(time.time())
            scans += 1
            mapped += sum(len(v.get("map", [])) for v in probe._live.values())
    scanning = threading.Thread(target=scanner, daemon=True)
    scanning.start()
    make = {n: jax.jit(lambda x, n=n: jnp.zeros((n,), jnp.float32) + x) for n in (256, 4096, 65536)}
    s = jnp.zeros(())
    live, t0, deleted = [], time.time(), 0
    while time.time() - t0 < float(sys.argv[1]):
        for f in make.values():
            live.append(f(s))
        if len(live) > 30:
            for a in live:
                a.delete()
                deleted += 1
            live = []
    stop = True
    # Joined as the agent joins its thread at exit: a daemon thread still
    # inside jaxlib (GIL released) when the interpreter finalizes is ended
    # by a forced unwind through C++ ("FATAL: exception not rethrown", SIGABRT).
    scanning.join()
    print(deleted, scans, mapped, int(addresses_askable()))
""")


def _run(code, *args, env=None, timeout=120):
    env = dict(env or os.environ, JAX_PLATFORMS="cpu")
    return subprocess.run([PY, "-c", code, *map(str, args)], capture_output=True, timeout=timeout, env=env)


def test_scanning_while_the_program_deletes_arrays_does_not_crash_it(child_env):
    res = _run(RACE, 6, env=child_env)
    assert res.returncode == 0, (res.returncode, res.stderr.decode()[-2000:])  # -11 before the guard
    deleted, scans, mapped, askable = map(int, res.stdout.split())
    assert deleted > 1000 and scans > 50  # both sides really ran
    # and addresses were read, where jaxlib tells them without side effects (0.10.1 on)
    assert mapped > 0 if askable else mapped == 0


def test_a_deleted_array_has_no_address_and_delete_is_given_back(child_env):
    code = textwrap.dedent("""
        import jax, jax.numpy as jnp
        from jax._src.array import ArrayImpl
        from jaxtop.probes import jax_memory as jm
        original = ArrayImpl.delete
        probe = jm.JaxMemoryProbe()
        assert ArrayImpl.delete is not original and ArrayImpl.delete.__wrapped__ is original
        a = (jnp.ones(1000) + 1).block_until_ready()
        asked = jm.ready_address(a)  # before jaxlib 0.10.1 asking would add an Array: not asked
        assert asked == (a.unsafe_buffer_pointer() if jm.addresses_askable() else jm.UNASKED)
        a.delete()
        assert a.is_deleted() and jm.ready_address(a) is None  # is_ready() here would segfault
        probe.close()
        assert ArrayImpl.delete is original
        assert jm.ready_address(jnp.ones(3) + 1) is None  # no lock in place: no question asked
        print("ok")
    """)
    res = _run(code, env=child_env)
    assert res.returncode == 0 and res.stdout.strip() == b"ok", res.stderr.decode()[-2000:]


def test_a_fork_while_the_agent_holds_the_lock_leaves_the_child_free_to_delete(child_env):
    code = textwrap.dedent("""
        import os, threading
        import jax, jax.numpy as jnp
        from jaxtop.probes import jax_memory as jm
        jm.JaxMemoryProbe()
        held, release = threading.Event(), threading.Event()
        def agent():
            with jm._delete_lock:
                held.set()
                release.wait()
        threading.Thread(target=agent, daemon=True).start()
        held.wait()
        pid = os.fork()
        if pid == 0:
            # What a delete() in the child takes first (JAX itself is not
            # usable after a fork): the parent's agent thread does not exist here.
            os._exit(0 if jm._delete_lock.acquire(timeout=5) else 1)
        release.set()
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status))
    """)
    res = _run(code, env=child_env, timeout=60)
    assert res.returncode == 0 and res.stdout.split()[-1] == b"0", (res.stdout, res.stderr.decode()[-2000:])
