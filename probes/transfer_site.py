"""One line of the program, in one direction, as the transfer-sites probe
tallies it: its transfers, calls and bytes, the arguments its calls copy
(named by the hook, or as jax's slow path saw them), the callee it shows,
and its history for the sparkline. :mod:`jaxtop.probes.transfer_sites`
ties the guard's lines to calls and credits them here.

Standard library only (this runs inside the user's job).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, replace

from jaxtop.probes.transfer_values import MAX_ARGS, ArgInfo

__all__ = ["SIZES_READ", "Site", "same_callee"]

#: Calls read that a line's bytes per call are the mean of.
SIZES_READ = 8


def _compared(now: tuple[ArgInfo, ...], before: tuple[ArgInfo, ...]) -> tuple[ArgInfo, ...]:
    """``now``'s arguments, each saying whether it was the same value as the
    argument of its name, kind and shape in ``before`` (the call read
    before): None where either has no token or there was none."""
    tokens = {(a.name, a.kind, a.shape): a.token for a in before if a.name and a.token is not None}
    out = []
    for a in now:
        then = tokens.get((a.name, a.kind, a.shape)) if a.name and a.token is not None else None
        out.append(a if then is None else replace(a, same=then == a.token))
    return tuple(out)


@dataclass
class Site:
    """One (direction, line, callee): what went through it."""

    count: int = 0
    interval: int = 0
    unlogged: int = 0  # since the last history entry
    calls: int = 0
    bytes: int = 0
    bytes_unknown: int = 0
    pieces: int = 1  # lines a value of a call logs (a pmap: one a device)
    count_pieces: int = 0  # lines credited, modulo a call's (where the cycle of sizes stands)
    args: tuple[ArgInfo, ...] = ()
    observed: bool = False  # the arguments seen passing (slow path), not read from a later call
    described_t: float = -1e18
    asked_t: float = -1e18  # when the hook was last asked to read this line's call's arguments
    # The arguments' sizes, where every one is known: per position, the
    # mean over the last SIZES_READ calls read of this many arguments. One
    # call's sizes stood for every call before: the line of JAX's MNIST
    # example that sizes the training set (float32[1024,784]) and then the
    # test set ([256,784]) in turn was credited 2.4x low whenever the call
    # read was a test set's (the hook is asked right after a line's
    # transfers come in, and the next call there was the other one).
    sizes: tuple[int, ...] = ()
    sizes_read: deque = field(default_factory=lambda: deque(maxlen=SIZES_READ))
    _named: bool = False  # some argument has a name
    callee: str = ""
    # The callee whose call ``args`` describe: a line that calls two things
    # (``jax.random.uniform(k, minval=a)`` then an op on its result) shows
    # the latest callee, and arguments that may be the other's.
    args_callee: str = ""
    history: deque = field(default_factory=lambda: deque(maxlen=60))  # counts per TIE_EVERY_TICKS ticks, a sparkline

    def add(self, n: int, calls: int) -> None:
        """``n`` lines of ``calls`` calls (one call can log several)."""
        self.count += n
        self.interval += n
        self.unlogged += n
        self.calls += calls
        sizes = self.sizes
        if sizes:
            size = len(sizes)
            if calls > 0 and n > calls * size:
                # More lines than values a call copies: each went in pieces
                # (a pmap splits an array's first axis over the devices, a
                # line a device, each of one slice's bytes). The most lines
                # a value seen in one batch is the pieces a value (a call's
                # lines can come in two batches: the fewer is no measure).
                self.pieces = max(self.pieces, n // (calls * size))
            # The values a call copies, in order (a call logs one line each
            # piece), each line a piece's share of its value. (Each line
            # credited a whole value read jax's spmd MNIST example 8x:
            # ~115 MiB/s for ~14.4 on 8 devices.)
            pieces = self.pieces
            lines = self.count_pieces
            whole, part = divmod(n, size * pieces)
            self.bytes += (whole * sum(sizes) * pieces
                           + sum(sizes[((lines + k) // pieces) % size] for k in range(part))) // pieces
            self.count_pieces = (lines + n) % (size * pieces)
        else:
            self.bytes_unknown += n

    @property
    def named(self) -> bool:
        return self._named


    def merge(self, described: tuple[ArgInfo, ...], observed: bool, t: float, callee: str) -> None:
        """Take what a call's arguments were. A call's own arguments, named
        (the hook's), replace what the slow path saw (unnamed, one record
        per kind of value); the slow path's records of one call add up."""
        if not described:
            return  # a call that passed nothing to copy says nothing of those that did
        named = any(a.name for a in described)
        if named or not self.args or not any(a.name for a in self.args):
            if named or t - self.described_t > 1.0:
                self.args = _compared(described, self.args)
            else:
                self.args = tuple(dict.fromkeys(self.args + described))[:MAX_ARGS]
            self.observed = observed
            self.described_t = t
            self.args_callee = callee
            self._named = any(a.name for a in self.args)
            sizes = tuple(a.nbytes for a in self.args)
            if sizes and all(isinstance(n, int) for n in sizes):
                self.sizes_read.append(sizes)
                alike = [read for read in self.sizes_read if len(read) == len(sizes)]
                self.sizes = tuple(sum(column) // len(alike) for column in zip(*alike))
            else:
                self.sizes = ()


def same_callee(a: str, b: str) -> bool:
    """One callee, though the slow path names an op without the fast
    path's ``(op)``."""
    return a.removesuffix(" (op)") == b.removesuffix(" (op)")
