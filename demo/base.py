"""What every demo strategy is made of: its sizes (:class:`Scale`), the
numbers it is judged by (:class:`Metric`) and the interface the runner
drives (:class:`Strategy`). The strategies themselves are in
:mod:`jaxtop.demo.strategies`.

A strategy exposes:
    ``variants``      names, the first is the baseline ("off")
    ``prepare(v)``    compile variant ``v`` (before the loop; no compile in steps)
    ``step(v)``       one step of variant ``v``
    ``drain(v)``      wait until every step dispatched so far has finished
    ``reset(v)``      put the workload back in its starting state, so that a
                      measurement starts from the same place whenever it runs
    ``block_metrics(v)`` figures of the block of steps just run, read again
                      for each block so that their spread is known
    ``static(v)``     metrics known from the compiled program (memory_analysis),
                      or from the jaxpr, measured not assumed
    ``metrics``       which measured metrics tell its story, with the direction
                      expected when going from the first to the second variant

Sizes come from a :class:`Scale` so the same code runs small on a 2-core CPU
and large on a GPU or TPU.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class Scale:
    """Workload sizes. ``for_backend`` picks them from the device."""

    width: int = 256  # matrix side
    batch: int = 64
    items: int = 16  # items per step in the batching strategy
    state_elems: int = 1 << 20  # donation state (4 MiB of float32)
    grow_rows: int = 64  # in-place buffer rows
    layers: int = 16  # checkpointing scan length
    frag_buffers: int = 64
    runahead_layers: int = 8  # layers of the run-ahead strategy's MLP
    # Rows of its batch: on an accelerator enough work per step that the
    # device, not Python, sets the pace (else nothing queues up).
    runahead_rows: int = 64

    @staticmethod
    def for_backend(backend: str, small: bool = False) -> "Scale":
        if small:
            return Scale(width=128, batch=32, items=8, state_elems=1 << 18, grow_rows=32, layers=8, frag_buffers=32,
                         runahead_layers=8, runahead_rows=32)
        if backend in ("gpu", "cuda", "rocm", "tpu"):
            return Scale(width=2048, batch=512, items=32, state_elems=1 << 26, grow_rows=256, layers=32, frag_buffers=256,
                         runahead_layers=8, runahead_rows=4096)
        return Scale()


@dataclass(frozen=True)
class Metric:
    """A number the strategy is judged by.

    Attributes:
        key: name in the measurement dict.
        label: shown in tables.
        unit: bytes, count, s, ratio.
        expect: direction from the first to the second variant: "down", "up",
            "zero" (second is 0, first > 0), or "" (informational).
        pair: the variants compared; default: the first two.
        short: the label in the Strategies panel's one-line rows.
        caveat: a likely cause when it moves the wrong way, shown beside a ✗.
    """

    key: str
    label: str
    unit: str
    expect: str
    pair: tuple[str, str] | None = None
    short: str = ""
    caveat: str = ""


#: Step times are wall-clock times on a shared machine.
TIMING_CAVEAT = "other load on the machine"


def analysis(compiled: Any) -> dict[str, int | None]:
    """The sizes of ``compiled.memory_analysis()``; {} where there is none."""
    try:
        m = compiled.memory_analysis()
    except Exception:
        return {}
    if m is None:
        return {}
    out = {}
    for name in ("temp_size_in_bytes", "alias_size_in_bytes", "output_size_in_bytes", "argument_size_in_bytes"):
        out[name] = getattr(m, name, None)
    return out


class Strategy(abc.ABC):
    name = ""
    title = ""
    variants: tuple[str, ...] = ("off", "on")
    about = ""
    metrics: tuple[Metric, ...] = ()
    #: How the values of a block metric over the blocks of one measurement
    #: become its value; a key not listed keeps the last block's.
    block_reduce: dict[str, Callable[[list[float]], float]] = {}
    #: The fewest steps in one block of a measurement.
    min_block_steps = 1

    def __init__(self, scale: Scale, device: Any) -> None:
        self.scale = scale
        self.device = device
        self._static: dict[str, dict[str, Any]] = {}

    def prepare(self, variant: str) -> None:
        """Compile the variant (called once per variant, before the loop)."""

    def reset(self, variant: str) -> None:
        """Back to the starting state before ``variant`` is measured.

        Only strategies whose steps build up state (buffers kept between
        steps) need it; a measurement must not depend on what ran before.
        """

    @abc.abstractmethod
    def step(self, variant: str) -> None:
        """One iteration of the workload in ``variant``."""

    def drain(self, variant: str) -> None:
        """Wait for every step dispatched so far.

        Most strategies wait for each step's outputs inside :meth:`step`;
        one that lets steps queue up on the device waits here, so that a
        block's time covers the device's work and the probes read after it
        see that work done.
        """

    def block_metrics(self, variant: str) -> dict[str, Any]:
        """Figures of the steps run since the last call (one block).

        The runner asks after each block of a measurement: the spread of a
        figure over the blocks is how much it varies by itself, and a change
        between variants must be larger to count.
        """
        return {}

    def static(self, variant: str) -> dict[str, Any]:
        return dict(self._static.get(variant, {}))
