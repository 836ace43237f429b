"""Which arguments of a jitted function its outputs could be written into:
the names a donation fix gives to ``donate_argnames``.

XLA's memory analysis says how many bytes a function's outputs and
arguments take, not which argument an output replaces. The compiled module
does: jax names every parameter of the entry computation after the argument
it came from (``metadata={op_name="params[0][0]"}``: the leaf ``[0][0]`` of
the argument ``params``; ``model.states[0][1]`` under Flax NNX's
``nnx.jit``, whose argument is ``model``), and the entry's root is the
outputs' shape. An argument is donatable when each of its leaves finds an
output leaf of the same dtype and shape not taken by an earlier argument
(in the order of the parameters): a training step's parameters and
optimizer state, not its batch.

Read once per executable, where it has no aliased output yet (where it has,
which arguments are already donated is in the module's header, whose text
is the whole module's: not read), and not for jax's own ops run outside
jit. Each read is a call into jaxlib per instruction of the entry
computation (thousands after XLA's fusion in a big model), in pieces with
the interpreter handed back between them: no one call walks the module.

Where the jaxlib has no entry instructions to read (0.4.30's HloComputation
has none), nothing is named, and a donation fix says in words what to donate.

Stdlib only; the executable is jaxlib's, handed in.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from jaxtop.probes.base import HandBack

__all__ = ["MAX_NAMES", "donatable", "donatable_args", "parse_parameter", "shapes_in"]

#: Argument names reported at most (a function of many arguments names its first).
MAX_NAMES = 8
#: Instructions of an entry computation read at most (a bigger one is not read).
MAX_INSTRUCTIONS = 20_000
#: Instructions read between two hand-backs of the interpreter (~0.5 ms).
PIECE = 500

_SHAPE = re.compile(r"\b(pred|[subf]\d+|bf16|f8e\w+|c64|c128)\[([\d,]*)\]")
_PARAMETER = re.compile(r"=\s*(\S+?)(?:\{[^}]*\})?\s+parameter\((\d+)\)(?:.*?op_name=\"([^\"]*)\")?")
_TOP = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def shapes_in(text: str) -> list[tuple[str, str]]:
    """The array shapes ``(dtype, dims)`` in an HLO shape's text, in order:
    ``(f32[4,3]{1,0}, s32[])`` gives ``[("f32", "4,3"), ("s32", "")]``."""
    return _SHAPE.findall(text)


def parse_parameter(text: str) -> tuple[int, tuple[str, str], str] | None:
    """``(number, (dtype, dims), op_name)`` of an entry parameter's text
    (``%x.1 = f32[4,3]{1,0} parameter(0), metadata={op_name="params[0][0]"}``);
    None for a parameter of another form (a tuple, no name)."""
    m = _PARAMETER.search(text)
    if m is None or not m.group(3):
        return None
    shapes = shapes_in(m.group(1))
    if len(shapes) != 1:
        return None
    return int(m.group(2)), shapes[0], m.group(3)


def _root_shape(text: str) -> str:
    """The shape part of an instruction's text: ``(f32[2], s32[]) tuple(...)``
    -> ``(f32[2], s32[])``."""
    _, _, rest = text.partition("= ")
    if not rest.startswith("("):
        return rest.split(" ", 1)[0]
    depth = 0
    for i, ch in enumerate(rest):
        depth += ch == "("
        depth -= ch == ")"
        if depth == 0:
            return rest[:i + 1]
    return rest


def donatable(params: list[tuple[int, tuple[str, str], str]], outputs: list[tuple[str, str]]) -> list[str]:
    """The top-level argument names whose every leaf an output leaf of the
    same dtype and shape can take, each output leaf taken once, arguments
    in the order of their first parameter."""
    free = Counter(outputs)
    leaves: dict[str, list[tuple[str, str]]] = {}
    for _, shape, op_name in sorted(params):
        top = _top(op_name)
        if top is not None:
            leaves.setdefault(top, []).append(shape)
    out = []
    for name, shapes in leaves.items():
        need = Counter(shapes)
        if all(free[s] >= n for s, n in need.items()):
            free -= need
            out.append(name)
            if len(out) >= MAX_NAMES:
                break
    return out


def donatable_args(executable: Any) -> tuple[list[str], bool] | None:
    """The arguments of a loaded executable its outputs could be written
    into, and whether they are Flax NNX graph states (``model.states[…]``:
    ``nnx.jit`` takes the same ``donate_argnames``); None where the module
    cannot be read so."""
    module = executable.hlo_modules()[0]
    entry = next((c for c in module.computations() if c.name.startswith("main")), None)
    if entry is None:
        return None
    instructions = entry.instructions()
    if len(instructions) > MAX_INSTRUCTIONS:
        return None
    params = []
    root = None
    hand_back = HandBack()
    for k, ins in enumerate(instructions):
        if k and k % PIECE == 0:
            hand_back()  # the program's threads get the interpreter back between pieces
        if str(ins.opcode).endswith("kParameter"):
            parsed = parse_parameter(ins.to_string())
            if parsed is None:
                return None
            params.append(parsed)
        elif root is None and not ins.users():
            root = ins
    if root is None or not params:
        return None
    names = donatable(params, shapes_in(_root_shape(root.to_string())))
    nnx = bool(names) and all(".states[" in op for _, _, op in params if _top(op) in names)
    return names, nnx


def _top(op_name: str) -> str | None:
    """The argument a parameter's name starts with (``params[0][0]`` ->
    ``params``); None where it starts with no identifier."""
    m = _TOP.match(op_name)
    return m.group(0) if m is not None else None
