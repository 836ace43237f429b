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
