"""Runs a target program with jaxtop's agent in-process and the holders
probe profiling every 0.5 s (the agent's default is every 5 s at most, on a
0.04 % budget): a test sees enough profiles in seconds.

argv: LOG TARGET [ARGS...]
"""

import runpy
import sys

import jaxtop
from jaxtop.probes.holders import HoldersProbe

handle = jaxtop.instrument(interval_s=0.1, log_path=sys.argv[1])
import jax  # noqa: E402,F401  (the probe profiles jax's backend)

HoldersProbe(interval_s=0.5, budget=0.2).install(handle.agent)
sys.argv = sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
