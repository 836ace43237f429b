"""The exit statuses of ``jaxtop``: their values and their one description."""

from __future__ import annotations

import signal

EXIT_USAGE = 2
EXIT_BUDGET = 3  # jaxtop.budgets.EXIT_BUDGET: `run --budget`, over budget
#: Exit status when the reader of the output went away (``| head``): what a
#: shell reports for a tool that SIGPIPE ended (128 + 13), reached quietly.
EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE
#: Exit status of an export ended by SIGTERM (128 + 15), its temporary file removed.
EXIT_TERMINATED = 128 + signal.SIGTERM

# Shown by `jaxtop --help`; the one place the exit statuses are listed.
EXIT_STATUS_HELP = """\
exit status:
  0    done (for `run`: the program's own status, as `python SCRIPT` would give)
  1    the action failed: injection or detach did not work, an export could not be written,
       a recording could not be written (`log`: a full disk, a size limit; one line says so)
  2    bad usage, or nothing to act on: no such process, no agent, the agent could not
       start (`run`), or a socket directory or socket that is not safe to trust (not a
       directory of yours that only you can write, or served by another uid); the
       message names the path and its owner
  3    `run --budget`: the program succeeded but went over its budget (the report is on
       stderr; docs/budgets.md). A program that fails keeps its own status and traceback
  130  interrupted (export)
  141  the reader of the output went away (`log` or `export -o -` into `| head`), quietly
  143  terminated by SIGTERM (export; its temporary file removed)"""

# Shown by `jaxtop --help`: every variable jaxtop reads.
ENVIRONMENT_HELP = """\
environment:
  JAXTOP_SOCKET_DIR          where agents' sockets are ($XDG_RUNTIME_DIR/jaxtop, else /tmp/jaxtop-UID)
  JAXTOP_PROMETHEUS_PORT     instrument(): also serve Prometheus metrics on this port
  JAXTOP_PROMETHEUS_PUSH     push the last metrics to this Pushgateway URL at exit
  JAXTOP_JOB                 the run's name: the `job` label of its metrics
  JAXTOP_OOM_DIR             where out-of-memory censuses are written (default: the working directory)
  JAXTOP_PROFILE_DIR         where memory profiles (`s`) are written (default $XDG_STATE_HOME/jaxtop/profiles)
  JAXTOP_CACHE_DIR           where replay indexes are kept (default $XDG_CACHE_HOME/jaxtop)
  JAXTOP_SPOOL_MAX_BYTES     a dashboard's on-disk history per process (compressed; default 256 MiB)
  JAXTOP_MAX_CLIENTS         connections an agent serves at once (default 64)
  JAXTOP_CLIENT_BUFFER_BYTES bytes an agent queues per slow client before dropping samples (default 16 MiB)
  JAXTOP_FD_RESERVE          file descriptors an agent always leaves to the program (default 128)
  JAXTOP_NUMPY_HOOKS         1: wrap np.array/np.asarray to count a CPU program's host reads through them
                             (~120 ns on every numpy call); default: not wrapped unless a host_syncs budget
                             asks (those reads go uncounted, and the screen says so); 0: never wrap
  JAXTOP_TRANSFER_SITES      0: do not tie implicit transfers to the program's lines (no hook on jitted
                             calls; transfers are still counted)
  JAXTOP_MAX_PAUSE_MS        the longest pause a live-array scan may put on the program (default 1; off:
                             no limit). jax.live_arrays() holds the interpreter ~0.14-0.37 us an array
                             (7-18 ms at 50,000); no scan predicted longer is taken, and the screen shows
                             the last scan's totals and says why. On a TPU, a libtpu metric whose call takes
                             longer in three readings in a row is read no more
  JAXTOP_ADVISE_WHOLE        1: `jaxtop advise FILE` decodes every line of a big recording instead of its
                             last window (benchmarks/advice.py compares the two)"""

# Shown by `jaxtop --help`.
EXAMPLES_HELP = """\
examples:
  jaxtop demo                                   the built-in workload and the dashboard
  jaxtop run train.py --lr 3e-4                 run a program with the agent (also: jaxtop run python train.py)
  jaxtop run --budget h2d=0,recompiles=0 -m pytest tests/   fail (exit 3) on implicit transfers or recompiles
  jaxtop advise train.jsonl                     which line misses which memory strategy, with the fix
  jaxtop attach 4101                            the dashboard on a running process (--inject if it has no agent)
  jaxtop snapshot 4101 --json > state.json      every panel's figures once, for scripts and bug reports
  jaxtop log 4101 -o run.jsonl.gz               record it; jaxtop replay run.jsonl.gz to watch it again
  jaxtop attach --prometheus http://prom:9090 --job run-42    every process of a multi-host job
  eval "$(jaxtop completions bash)"             tab completion (also zsh, fish)"""
