"""Adversarial: a busy program forks while its threads use every path of
jaxtop's at once, stderr included.

tests/adversarial/test_fork_stress.py forks amid host reads and deletes.
Here the other threads also write to stderr through the relay's pipe, make
implicit transfers (the guard's lines, which the relay counts and reports),
compile (jax's compile events and cache-miss records, through jaxtop's
listeners and log filter), wait for exact transfer totals (sync markers
written to fd 2 under the capture's lock, the relay kicked), label trees,
and read and delete arrays, while three threads fork as fast as they can
and the agent samples every 10 ms. Each child goes through the hooks a
child can reach: a host read, a compile event, a cache-miss record, its own
lines on stderr (more than a pipe holds, so that it also waits on the
relay); it must be gone within the timeout, and every line it wrote must
reach the program's stderr.

The children stay clear of what hangs in JAX itself (see that module): they
read only arrays of their own forking thread, through numpy, and never
compile or delete. They write to fd 2 with ``os.write``, not through
``sys.stderr``: Python copies ``sys.stderr``'s buffer lock into a child as
it is, held or not, and the program's own threads hold it while they
write (a hang of Python's, with or without jaxtop).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

PY = sys.executable
FORKS = 600
TIMEOUT_S = 10.0
#: Forking stops after this long even if fewer children were made (two
#: shared cores): the test must stay under a minute.
FORKING_S = 35.0

PROGRAM = r"""
import faulthandler, json, logging, os, signal, sys, threading, time, warnings
import jaxtop

h = jaxtop.instrument(interval_s=0.01)  # the agent's thread samples (and takes its locks) often
import jax
import jax.numpy as jnp
import numpy as np
from jax import monitoring

warnings.filterwarnings("ignore", message="os.fork")  # JAX's warning, once per fork otherwise
FORKS, TIMEOUT_S, DUMP, FORKING_S = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3], float(sys.argv[4])
dump_fd = os.open(DUMP, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
agent = h.agent
reads = agent.host_sync
compiles = agent.compile
miss_log = logging.getLogger("jax._src.pjit")  # where jax logs its tracing-cache misses
shared = jnp.arange(16.0)
shared.block_until_ready()
stop = threading.Event()
lock = threading.Lock()
pending = {}  # pid -> deadline (monotonic)
made = [0]
stopped_forking = [False]
BULK = b"." * 4095 + b"\n"


def reader():
    while not stop.is_set():
        np.asarray(shared)
        float(shared[3])


def deleter():
    k = 0
    while not stop.is_set():
        k += 1
        x = jnp.ones(8) * k
        float(x[0])
        x.delete()


def compiler():  # a new shape each time: a compile, its events, a cache-miss record
    n = 0
    while not stop.is_set():
        n += 1
        jax.jit(lambda x: x * 2 + 1)(jnp.ones((n % 97 + 1,))).block_until_ready()


def transferer():  # implicit host-to-device transfers: the guard writes a line to fd 2 for each
    x = np.ones(4, np.float32)
    add = jax.jit(lambda a: a + 1)
    while not stop.is_set():
        add(x).block_until_ready()


def writer():  # the program's own stderr lines
    k = 0
    while not stop.is_set():
        k += 1
        os.write(2, b"parent line %d\n" % k)
        time.sleep(0.0005)


def syncer():  # exact totals: a marker on fd 2 under the capture's lock, the relay kicked
    while not stop.is_set():
        agent.transfer_totals(sync_timeout_s=0.5)


def labeller():
    tree = {"w": jnp.ones(4), "b": jnp.zeros(3)}
    while not stop.is_set():
        jaxtop.label("tree", tree)
        time.sleep(0.0005)


def child(vec):
    # A child that hangs dumps where (every thread it has) and exits 1.
    faulthandler.dump_traceback_later(TIMEOUT_S * 0.8, exit=True, file=dump_fd)
    before_reads, before_compiles = reads.total, compiles.total()
    np.asarray(vec)  # a host read through jaxtop's numpy hooks
    monitoring.record_event_duration_secs("/jax/core/compile/backend_compile_duration", 0.01, fun_name="child")
    miss_log.warning("TRACING CACHE MISS at child.py:1 (child) costing 1.0 ms because: never seen function")
    for _ in range(40):  # 160 KiB: with the other writers, the pipe fills now and then
        os.write(2, BULK)
    os.write(2, b"child %d done\n" % os.getpid())
    counted = reads.total > before_reads and compiles.total() > before_compiles
    os._exit(0 if counted else 4)  # 4: the hooks counted nothing


def forker():
    one = jnp.float32(1.5)
    one.block_until_ready()
    t0 = time.monotonic()
    while not stop.is_set():
        with lock:
            if made[0] >= FORKS or time.monotonic() - t0 > FORKING_S:
                stopped_forking[0] = True
                return
            made[0] += 1
        vec = jnp.arange(8.0) * made[0]
        vec.block_until_ready()
        pid = os.fork()
        if pid == 0:
            try:
                child(vec)
            finally:
                os._exit(3)
        with lock:
            pending[pid] = time.monotonic() + TIMEOUT_S
        time.sleep(0.001)


workers = [threading.Thread(target=f) for f in (reader, reader, deleter, compiler, transferer, writer, syncer, labeller)]
forkers = [threading.Thread(target=forker) for _ in range(3)]
t0 = time.monotonic()
for t in workers + forkers:
    t.start()
codes, killed, children = {}, 0, []
while True:
    with lock:
        waiting = list(pending.items())
        forking = any(t.is_alive() for t in forkers)
    if not forking and not waiting:
        break
    now = time.monotonic()
    for pid, deadline in waiting:
        got, status = os.waitpid(pid, os.WNOHANG)
        if got == 0 and now < deadline:
            continue
        if got == 0:  # still there at its deadline: hung
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            killed += 1
        else:
            code = str(os.waitstatus_to_exitcode(status))
            codes[code] = codes.get(code, 0) + 1
        children.append(pid)
        with lock:
            del pending[pid]
    time.sleep(0.005)
stop.set()
for t in workers + forkers:
    t.join()
totals = agent.transfer_totals(sync_timeout_s=5.0)
print("RESULT " + json.dumps({"forks": made[0], "codes": codes, "killed": killed, "children": children,
                              "parent_reads": reads.total, "compiles": compiles.total(), "h2d": totals["h2d"],
                              "seconds": round(time.monotonic() - t0, 1)}), flush=True)
h.stop()
"""


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_forks_amid_stderr_transfers_compiles_and_syncs_leave_no_child_hanging(child_env, tmp_path):
    script = tmp_path / "fork_stress_stderr.py"
    script.write_text(PROGRAM)
    dump = tmp_path / "hung.txt"
    err_path = tmp_path / "stderr"
    env = dict(child_env, JAXTOP_NUMPY_HOOKS="1")  # the children's reads are counted by numpy's wrappers
    with open(err_path, "wb") as err:
        run = subprocess.run([PY, str(script), str(FORKS), str(TIMEOUT_S), str(dump), str(FORKING_S)], env=env,
                             stdout=subprocess.PIPE, stderr=err, text=True, timeout=100)
    stderr = err_path.read_bytes()
    assert run.returncode == 0, stderr[-3000:]
    result = json.loads(next(l for l in run.stdout.splitlines() if l.startswith("RESULT "))[len("RESULT "):])
    where = dump.read_text()[:4000] if dump.exists() else ""
    forks = result["forks"]
    assert forks >= 200, result  # enough forks to mean something, even on a slow machine
    # Exit 1: the child hung and its watchdog ended it (where it hung is in
    # the dump); killed: it did not even get that far.
    assert result["codes"] == {"0": forks} and result["killed"] == 0, (result, where)
    # The other threads did their part meanwhile.
    assert result["parent_reads"] > forks and result["compiles"] > 10 and result["h2d"] > 100, result
    # Every child's stderr reached the program's, through the relay, whole.
    done = set(map(int, re.findall(rb"^child (\d+) done$", stderr, re.M)))
    assert done == set(result["children"]), (len(done), forks)
    assert b"transfer:" not in stderr  # the guard's lines were jaxtop's, counted and taken out
