"""Holds known arrays made at known lines, then allocates too much.

Run plainly or with the OOM census (``OOM_TARGET_MODE=census``): the output,
the traceback and the exit status must be the same. ``OOM_TARGET_CATCH=1``
catches the error and goes on; ``OOM_TARGET_THREAD=1`` lets it end a worker
thread, uncaught, while the main thread goes on; ``OOM_TARGET_LOG`` records
the stream; ``OOM_TARGET_WAIT=PATH`` waits, holding, until PATH exists (a
test injects the agent meanwhile). The address-space limit is set relative to what the process maps
once jax is up (thread stacks and arenas differ per machine: a fixed 3 GiB
leaves no room for 2 GiB on a 2-core VM), so the big request fails however
many cores the machine has.
"""

import os
import resource

MODE = os.environ.get("OOM_TARGET_MODE", "plain")
if MODE == "census":
    import jaxtop

    handle = jaxtop.instrument(log_path=os.environ.get("OOM_TARGET_LOG"))

import jax
import jax.numpy as jnp

if MODE == "census":
    from jaxtop.probes.oom import install

    install(handle.agent)

MiB = 1 << 20


def make_cache():
    return [jnp.full((32 * MiB,), i, jnp.float32) for i in range(6)]  # CACHE_LINE: 6 x 128 MiB


def make_buffers():
    return [jnp.zeros((16 * MiB,), jnp.float32) + i for i in range(2)]  # BUFFERS_LINE: 2 x 64 MiB


def params():
    return {"w": jnp.ones((1024, 1024), jnp.float32), "b": jnp.ones((1024,), jnp.float32)}  # PARAMS_LINE


def vm_size():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize")


def main():
    p = params()
    jax.block_until_ready(p)
    cache = make_cache()
    buffers = make_buffers()
    jax.block_until_ready((cache, buffers))
    print("holding", len(cache), len(buffers), flush=True)
    go = os.environ.get("OOM_TARGET_WAIT")
    if go:  # a test attaches jaxtop now (gdb injection), then creates this file
        import time

        deadline = time.monotonic() + 120
        while not os.path.exists(go) and time.monotonic() < deadline:
            time.sleep(0.05)
    limit = vm_size() + (1536 * MiB)
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
    if os.environ.get("OOM_TARGET_CATCH"):
        try:
            big = jnp.ones((512 * MiB,), jnp.float32)  # CAUGHT_OOM_LINE: 2 GiB
        except (getattr(jax.errors, "JaxRuntimeError", None) or jax.lib.xla_client.XlaRuntimeError) as exc:
            print("caught:", str(exc).splitlines()[0], flush=True)
        small = jnp.ones((4,)) * 2
        print("went on:", float(small.sum()), len(cache), len(buffers), flush=True)
        return
    if os.environ.get("OOM_TARGET_THREAD"):
        # Uncaught in a worker thread: threading.excepthook reports it and
        # the program goes on.
        import threading

        worker = threading.Thread(target=lambda: jnp.ones((512 * MiB,), jnp.float32), name="loader")  # THREAD_OOM_LINE
        worker.start()
        worker.join()
        print("main goes on:", len(cache), len(buffers), flush=True)
        return
    big = jnp.ones((512 * MiB,), jnp.float32)  # OOM_LINE: 2 GiB
    print("unreachable", big.shape)


if __name__ == "__main__":
    main()
