"""The demo workload process: ``python -m jaxtop.demo.worker``.

Starts the agent, compiles every strategy, then waits for a strategy to be
picked (agent commands), measures each switch and steps the running one
until its parent (``jaxtop demo``) goes away.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="smallest sizes")
    parser.add_argument("--interval", type=float, default=0.1)
    parser.add_argument("--log", help="also record the stream to this file")
    args = parser.parse_args(argv)

    import jaxtop

    handle = jaxtop.instrument(interval_s=args.interval, log_path=args.log)
    import jax

    jax.numpy.zeros(()).block_until_ready()  # create the backend before the agent reports devices
    from jaxtop.demo.runner import DemoRunner

    runner = DemoRunner(handle.agent, small=args.small)
    agent = handle.agent
    agent.register_command("demo_set", lambda a: runner.request(a["strategy"], a.get("variant")))
    agent.register_command("demo_state", lambda a: runner.state())
    last = {"version": -1}

    def demo_field():
        # Sent when something changed: the model keeps the latest.
        state = runner.state_if_changed(last["version"])
        if state is not None:
            last["version"] = state["version"]
        return state

    agent.register_sample_field("demo", demo_field)
    stop = threading.Event()
    parent = os.getppid()

    def watch_parent():
        while not stop.wait(0.5):
            if os.getppid() != parent:
                stop.set()

    threading.Thread(target=watch_parent, daemon=True).start()
    # The demo ends its workload with SIGTERM; a closed terminal sends SIGHUP
    # to both. Either way: finish the step and leave through the agent's
    # exit path, which removes its socket.
    signal.signal(signal.SIGTERM, lambda *a: stop.set())
    signal.signal(signal.SIGHUP, lambda *a: stop.set())
    print(f"jaxtop demo worker pid {os.getpid()} on {runner.backend}, socket {handle.socket_path}", flush=True)
    try:
        runner.loop(stop)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
