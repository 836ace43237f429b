"""Adversarial: the program forks while one of jaxtop's threads holds a lock
that is not a :class:`jaxtop.probes.forksafe.ForkLock`.

``os.fork()`` copies each lock as it is, held or not, and none of the other
threads: whatever the child then takes that another thread held at the fork
waits forever. jaxtop's own locks are renewed in the child (ForkLock and the
probes' fork handlers); two more were not:

* Python's import lock of a module that one of jaxtop's threads was still
  importing (the agent imports a few modules only when first needed: a
  command's, the Prometheus exposition's). The child's import of that module
  waited for a thread it does not have.
* The budget meter's condition, which its reader thread takes for every
  sample and the program's thread at each edge of a measured window.

Each test holds the lock in another thread at the fork, deterministically;
the child must finish within seconds (SIGALRM ends one that hangs).
"""

from __future__ import annotations

import subprocess
import sys

PY = sys.executable

#: First imported on the agent's thread, where it takes long enough for the
#: program to fork meanwhile; in any other process it imports at once.
SLOW_MODULE = r"""
import os, time

if os.getpid() == int(os.environ["SLOW_IMPORT_PID"]):
    os.write(int(os.environ["SLOW_IMPORT_FD"]), b"i")  # the agent's thread is inside this import
    time.sleep(2)
VALUE = 42
"""

FORK_WHILE_THE_AGENT_IMPORTS = r"""
import os, signal, sys
import jaxtop
from jaxtop.wire.client import AgentConnection

sys.path.insert(0, sys.argv[1])
importing_r, importing_w = os.pipe()
os.environ["SLOW_IMPORT_PID"], os.environ["SLOW_IMPORT_FD"] = str(os.getpid()), str(importing_w)
h = jaxtop.instrument(interval_s=0.05)


def lazily(args):
    import slow_to_import  # as the agent's own commands import what only they need

    return {"value": slow_to_import.VALUE}


h.agent.register_command("lazily", lazily)
conn = AgentConnection.open(os.getpid())
conn.send_command("lazily", {})
os.read(importing_r, 1)
pid = os.fork()
if pid == 0:
    signal.alarm(5)
    import slow_to_import

    os._exit(0 if slow_to_import.VALUE == 42 else 3)
_, status = os.waitpid(pid, 0)
print("child", os.waitstatus_to_exitcode(status), flush=True)
conn.close()
h.stop()
"""


def test_a_child_imports_a_module_the_agents_thread_was_importing_at_the_fork(child_env, tmp_path):
    (tmp_path / "slow_to_import.py").write_text(SLOW_MODULE)
    script = tmp_path / "fork_in_import.py"
    script.write_text(FORK_WHILE_THE_AGENT_IMPORTS)
    with open(tmp_path / "stderr", "wb") as err:
        run = subprocess.run([PY, str(script), str(tmp_path)], env=child_env, stdout=subprocess.PIPE, stderr=err,
                             timeout=60)
    assert run.returncode == 0, (tmp_path / "stderr").read_bytes()[-2000:]
    # -14 (SIGALRM): the child waited on the module's import lock, held by
    # the agent's thread, which the child does not have.
    assert run.stdout.split() == [b"child", b"0"], run.stdout


FORK_WHILE_THE_METER_IS_HELD = r"""
import os, signal, threading, time
import jaxtop
from jaxtop.budgets.meter import Meter

h = jaxtop.instrument(interval_s=0.05)
meter = Meter(h.agent)
stream = meter.stream
assert stream is not None, meter.stream_na
held, release = threading.Event(), threading.Event()


def holder():
    with stream.cond:  # as the meter's reader thread does with each sample
        held.set()
        release.wait(10)


t = threading.Thread(target=holder)
t.start()
assert held.wait(5)
pid = os.fork()
if pid == 0:
    signal.alarm(5)
    # A window's edge in the child: the next reading, or after the timeout
    # the latest (the reader thread is the parent's).
    stream.wait(time.time() + 3600, 0.2)
    os._exit(0)
release.set()
t.join()
_, status = os.waitpid(pid, 0)
print("child", os.waitstatus_to_exitcode(status), flush=True)
meter.close()
h.stop()
"""


def test_a_child_measures_although_another_thread_held_the_meters_condition(child_env, tmp_path):
    script = tmp_path / "fork_in_meter.py"
    script.write_text(FORK_WHILE_THE_METER_IS_HELD)
    with open(tmp_path / "stderr", "wb") as err:
        run = subprocess.run([PY, str(script)], env=child_env, stdout=subprocess.PIPE, stderr=err, timeout=60)
    assert run.returncode == 0, (tmp_path / "stderr").read_bytes()[-2000:]
    assert run.stdout.split() == [b"child", b"0"], run.stdout


FORK_DURING_A_CENSUS = r"""
import os, signal, threading
from jaxtop.probes.oom import monitor as oom

m = oom.install(directory=os.environ["CENSUS_DIR"], note=False, profile=False)
real_build = oom.build_census
inside, release = threading.Event(), threading.Event()


def slow_build(**kwargs):  # another thread's census, under way at the fork
    inside.set()
    release.wait(10)
    return real_build(**kwargs)


oom.build_census = slow_build
t = threading.Thread(target=lambda: m.census("RESOURCE_EXHAUSTED: out of memory", {"how": "test"}), name="worker")
t.start()
assert inside.wait(5)
pid = os.fork()
if pid == 0:
    signal.alarm(5)
    oom.build_census = real_build
    census = m.census("RESOURCE_EXHAUSTED: out of memory in the child", {"how": "test"}, force=True)
    os._exit(0 if census is not None else 5)  # 5: refused, as if a census were still running
release.set()
t.join()
_, status = os.waitpid(pid, 0)
print("child", os.waitstatus_to_exitcode(status), flush=True)
oom.uninstall()
"""


def test_a_child_takes_its_own_census_although_another_thread_was_taking_one_at_the_fork(child_env, tmp_path):
    """The OOM monitor takes one census at a time, marked under its lock;
    the mark of a census another thread had under way stayed in the child,
    where no thread would ever clear it: every census refused."""
    script = tmp_path / "fork_in_census.py"
    script.write_text(FORK_DURING_A_CENSUS)
    env = dict(child_env, CENSUS_DIR=str(tmp_path))
    with open(tmp_path / "stderr", "wb") as err:
        run = subprocess.run([PY, str(script)], env=env, stdout=subprocess.PIPE, stderr=err, timeout=60)
    assert run.returncode == 0, (tmp_path / "stderr").read_bytes()[-2000:]
    assert run.stdout.split() == [b"child", b"0"], run.stdout


#: Blocking primitives the in-process code may make, where no thread of the
#: program waits on them in a child: set and waited for by jaxtop's own
#: threads, or read with ``is_set()``, which takes no lock.
EVENTS_OF_OWN_THREADS = {
    "jaxtop/agent/agent.py",  # _stopped (is_set() on the program's threads), _final_done (atexit: inert in a child)
    "probes/nvml.py",  # _stop: the agent and the NVML poll thread
    "probes/tpu_monitoring.py",  # _stop: the agent and the TPU poll thread
}


def test_no_other_blocking_primitive_in_the_process_is_left_to_a_fork():
    """Beyond plain locks (tests/test_forksafe.py): a condition on its default
    lock, a semaphore, a queue or a raw lock in the code that runs inside the
    user's process would be copied held into a child just the same."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    pattern = re.compile(r"threading\.(Condition\(\s*\)|Semaphore\(|BoundedSemaphore\(|Barrier\(|Event\()"
                         r"|\bqueue\.(Simple|Lifo|Priority)?Queue\(|_thread\.(allocate_lock|RLock)\(")
    found = []
    for base in ("probes", "jaxtop/agent", "jaxtop/budgets"):
        for path in sorted((root / base).rglob("*.py")):
            rel = str(path.relative_to(root))
            for n, line in enumerate(path.read_text().splitlines(), 1):
                match = pattern.search(line)
                if match is None or line.lstrip().startswith("#"):
                    continue
                if match.group(1) == "Event(" and rel in EVENTS_OF_OWN_THREADS:
                    continue
                found.append(f"{rel}:{n}: {line.strip()}")
    assert found == [], "renew it in a forked child (jaxtop.probes.forksafe.ForkLock):\n" + "\n".join(found)
