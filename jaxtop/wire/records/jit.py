"""The jit ledger: the sample's ``jit`` (its changes, or the whole table) and
the ``jit_ledger`` command's table (:class:`Jit` both; the command's reply
holds it in :class:`JitLedgerResult`).

The agent builds them in ``jaxtop.probes.jit_tables`` (totals, flags, rows),
``jaxtop.probes.jit_entries`` (an executable's row) and
``jaxtop.probes.cache_misses`` (a recompile reason); docs/protocol.md, "Jit
ledger", says what each field means. Its reader is
:mod:`jaxtop.dashboard.ledger`.
"""

from __future__ import annotations

from typing import Annotated, Union

import msgspec

from jaxtop.wire.records.base import Num, Rec, Time

#: A Python argument's name (a donation fix pastes it as code).
ArgName = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")]

__all__ = ["Jit", "JitExecutable", "JitExplain", "JitFunctionRow", "JitLeak", "JitLedgerResult", "JitReason", "JitStorm"]


class JitReason(Rec):
    """One recompile reason (``functions[].reasons[]``): why jax traced a
    function again (its tracing-cache-miss explanation)."""

    t: Time = None  # when the miss was logged
    # types (an argument's shape or dtype), static (a static argument's
    # value), redefined (a new function object on a line traced before),
    # other (told in ``text``)
    kind: str | None = None
    call_site: str | None = None  # file:line of the call that missed the cache
    call_fn: str | None = None
    traced_at: str | None = None  # jax's own line, where call_site is the program's line above a library's wrapper
    arg: str | None = None  # the (first) argument that changed
    old: str | None = None  # its type or value before
    new: str | None = None  # and now
    same_repr: bool | None = None  # static: both values print alike (no __eq__/__hash__ by value)
    diffs: list[list[str]] | None = None  # [[arg, old, new], ...] when several arguments changed (at most 4)
    text: str | None = None  # the explanation itself (kinds other than types; at most 600 characters)


class JitFunctionRow(Rec):
    """One function name of the ledger (``functions[]``). The sizes, flops
    and bytes accessed are its largest live executable's (None when none is
    live)."""

    name: str | None = None  # the compiled module's name: jit_train_step, jit__lambda
    compiles: Num = None  # since the agent started
    compiles_source: str | None = None  # monitoring (exact) or executables (a lower bound)
    compile_s: Num = None  # seconds of backend compiles (None with executables)
    live: Num = None  # its live executables
    argument_bytes: Num = None
    output_bytes: Num = None
    alias_bytes: Num = None  # outputs aliased to (donated) arguments
    temp_bytes: Num = None  # XLA's temporaries
    peak_bytes: Num = None  # XLA's estimate, where the jaxlib gives it
    code_bytes: Num = None  # generated code of all its live executables
    flops: Num = None
    bytes_accessed: Num = None
    call_site: str | None = None  # file:line that compiled its newest executable
    defined_at: str | None = None  # file:line of its definition (from the explanations)
    first_t: Time = None  # first compile or sighting
    last_t: Time = None  # last compile or sighting
    reasons: list[JitReason] | None = None  # its last 8 recompile reasons, oldest first
    reasons_total: Num = None  # recompile reasons since the agent started
    eager_compiles: Num = None  # compiles of jax's own op run outside jit (never a recompile)
    # Where its largest live executable has no aliased output: the top-level
    # arguments its outputs could be written into (donate_argnames), and
    # whether they are Flax NNX graph states (nnx.jit takes the same names).
    donatable: Annotated[list[ArgName], msgspec.Meta(max_length=8)] | None = None
    donatable_nnx: bool | None = None


class JitExecutable(Rec):
    """One live executable (``executables[]``), or one freed recently
    (``gone_recent[]``, with ``last_t``). A figure that could not be read is
    None with its reason beside it."""

    id: int | None = None  # the agent's number, unique in the process (``gone`` names it)
    name: str | None = None  # its function's compiled module name
    fingerprint: str | None = None  # XLA's (hex where the digest is binary)
    argument_bytes: Num = None
    output_bytes: Num = None
    alias_bytes: Num = None
    temp_bytes: Num = None
    code_bytes: Num = None
    peak_bytes: Num = None
    host: dict[str, Num] | None = None  # the host-side sizes, by the names above, only those not zero
    flops: Num = None
    bytes_accessed: Num = None
    call_site: str | None = None  # file:line of the program's call that compiled it
    call_fn: str | None = None
    first_t: Time = None  # the pass that first saw it
    last_t: Time = None  # gone_recent: when it was found freed
    eager: bool | None = None  # compiled by jax's eager dispatch: an op run outside jit
    # Where it aliases no output yet: the arguments its outputs could be
    # written into, and whether they are Flax NNX graph states (its
    # function's row carries its largest executable's).
    donatable: Annotated[list[ArgName], msgspec.Meta(max_length=8)] | None = None
    donatable_nnx: bool | None = None
    stats_reason: str | None = None  # why the sizes are None
    cost_reason: str | None = None  # why flops and bytes_accessed are None
    call_site_reason: str | None = None  # why call_site is None


class JitExplain(Rec):
    """``explain``: whether recompile reasons are recorded
    (``jax_explain_cache_misses``), and by whose option."""

    enabled: bool | None = None
    by: str | None = None  # jaxtop, or user (the program's own setting)
    misses_total: Num = None  # cache-miss records read
    hidden_total: Num = None  # those kept from the program (jaxtop's own)
    reason: str | None = None  # why there are no reasons


class JitLeak(Rec):
    """``leak``: the live-executable count (ops left out) rose on ``passes``
    passes in a row with nothing freed."""

    message: str | None = None  # the cause, as the dashboard shows it
    since_t: Time = None  # the pass the growth started from: one flag per since_t
    from_count: Num = None  # live executables then
    count: Num = None  # and now
    growth: Num = None
    seconds: Num = None  # since since_t
    passes: Num = None
    site: str | None = None  # the call site of most of the new executables
    function: str | None = None  # the function most of them belong to


class JitStorm(Rec):
    """``storm``: one function compiling again and again."""

    message: str | None = None  # the cause, as the dashboard shows it
    since_t: Time = None  # stays while the storm lasts: one event per since_t
    t: Time = None  # its function's last compile
    function: str | None = None  # the ledger's name (jit_step)
    name: str | None = None  # the program's (step)
    kind: str | None = None  # eager, types, static, redefined, other or unknown
    compiles: Num = None  # in the last window_s
    compiles_total: Num = None  # since the agent started
    window_s: Num = None
    rate_per_s: Num = None  # over the seconds the compiles came in
    site: str | None = None  # the call site of its newest executable


class Jit(Rec):
    """The sample's ``jit``: the whole table (``full``) or the changes since
    the last field; also the ``jit_ledger`` command's ``result.jit_ledger``
    (a whole table with every live executable and ``gone_recent``). A
    process where jax could not be read sends only ``available`` (false)
    and ``reason``; a sample where the probe raised, only ``error``."""

    available: bool | None = None  # False: the ledger is n/a, ``reason`` says why
    reason: str | None = None
    full: bool | None = None  # a whole table (True) or changes (False)
    t: Time = None  # the pass the numbers come from
    live_count: Num = None  # live executables at that pass (all backends)
    code_bytes: Num = None  # generated code of the live executables, device and host
    pending: Num = None  # live executables not analysed yet
    pass_s: Num = None  # wall time of that pass
    pass_every_s: Num = None  # the least time between two passes over an unchanged set now
    compiles_total: Num = None  # backend compiles seen
    compiles_unattributed: Num = None  # those without a function name (jax < 0.6.2)
    explain: JitExplain | None = None
    leak: JitLeak | None = None
    # UNSET: an agent from before the storm flag (its trend left ops out,
    # and its readers fold that trend apart); None: no storm.
    storm: Union[JitStorm, None, msgspec.UnsetType] = msgspec.UNSET
    executables_reason: str | None = None  # why the executables are n/a (present only then)
    compiles_reason: str | None = None  # why compiles are n/a (present only then)
    functions: list[JitFunctionRow] | None = None  # whole table: every function; changes: those that changed
    executables: list[JitExecutable] | None = None  # whole table: the largest; changes: the new ones
    executables_left_out: Num = None  # executables not listed
    gone: list[int] | None = None  # changes: ids of executables freed since the last field
    trend: list[tuple[Time, Num]] | None = None  # whole table: [t, live_count] of the last passes
    gone_recent: list[JitExecutable] | None = None  # the command's: the last freed executables
    error: str | None = None  # instead of the above: the probe raised while taking this sample, why

    @property
    def storm_sent(self) -> bool:
        """Whether the agent sends the storm flag at all (agents before it
        did not, and their whole tables' trend left ops out)."""
        return self.storm is not msgspec.UNSET

    @property
    def storm_flag(self) -> JitStorm | None:
        """The compile storm, if any (an agent before the flag: none)."""
        return None if self.storm is msgspec.UNSET else self.storm


class JitLedgerResult(Rec):
    """The ``jit_ledger`` command's ``result`` (a reply's result is decoded
    by whoever asked: :func:`jaxtop.wire.records.decoder.reply_result`)."""

    jit_ledger: Jit | None = None  # None: the reply is another command's
