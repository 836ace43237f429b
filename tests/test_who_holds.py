"""Who keeps an array alive, by the program's own names (probes/who_holds.py):
the paths found, the program's code never run, the search bounded."""

from __future__ import annotations

import sys
import types

import numpy as np

from jaxtop.probes import who_holds
from jaxtop.probes.who_holds import holders_of

NEVER = []  # what the program's own code recorded being called by the search


def _module(name: str, **names) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__file__ = f"/work/user/{name}.py"
    vars(mod).update(names)
    sys.modules[name] = mod
    return mod


def _user(filename: str) -> bool:
    return not filename.startswith("/work/user/")  # everything else is a library here


class Trainer:
    def __init__(self) -> None:
        self.cache: dict = {}
        self.outs: list = []


class Slotted:
    __slots__ = ("kept",)


class Hostile:
    """Every hook a search could trip on records it: none may run."""

    def __getattr__(self, name):
        NEVER.append(("getattr", name))
        raise AttributeError(name)

    def __eq__(self, other):
        NEVER.append("eq")
        return False

    def __hash__(self):
        NEVER.append("hash")
        return 1

    def __repr__(self):
        NEVER.append("repr")
        return "hostile"

    @property
    def __class__(self):  # read by isinstance and obj.__class__: its code
        NEVER.append("__class__")
        return Hostile

    @property
    def __dict__(self):  # a class's own __dict__ property: its code, not read
        NEVER.append("__dict__")
        return {}


def test_each_holder_is_named_as_the_program_would_write_it():
    a, b, c, d = (np.full(3, i) for i in range(4))
    trainer, keeper = Trainer(), Slotted()
    trainer.cache["s2"], keeper.kept = b, c
    trainer.outs += [np.ones(1), d]
    mod = _module("who_prog", history=[np.ones(1), a, np.ones(1)], trainer=trainer, keeper=keeper)
    try:
        got = holders_of([a, b, c, d], is_library=_user)
    finally:
        del sys.modules["who_prog"]
    assert got["paths"] == {"who_prog.history[…]": 1, "who_prog.trainer.cache['s2']": 1, "who_prog.keeper.kept": 1,
                            "who_prog.trainer.outs[…]": 1}
    assert got["unnamed"] == 0 and got["complete"]
    del mod


def test_a_running_functions_local_is_a_name_too():
    def user_or_this_test(filename: str) -> bool:
        return _user(filename) and filename != __file__

    def step():
        outs = [np.ones(2)]
        return holders_of([outs[0]], is_library=user_or_this_test), outs

    got, _ = step()
    assert got["paths"] == {"step() local outs[…]": 1}


def test_the_programs_code_never_runs_and_its_odd_keys_are_not_shown():
    arr = np.ones(4)
    hostile = Hostile()
    _module("who_hostile", table={hostile: arr, 7: [arr]}, obj=hostile)
    NEVER.clear()
    try:
        got = holders_of([arr], is_library=_user)
    finally:
        del sys.modules["who_hostile"]
    assert NEVER == [], NEVER
    # A key of the program's type is not shown ([…]), nor is an int key (folded like an index).
    assert got["paths"] == {"who_hostile.table[…]": 1, "who_hostile.table[…][…]": 1}


def test_library_modules_are_no_start_and_an_unreachable_array_is_unnamed():
    arr = np.ones(2)
    _module("who_lib", kept=[arr])
    vars(sys.modules["who_lib"])["__file__"] = "/usr/lib/python3/site-packages/who_lib.py"
    try:
        got = holders_of([arr], is_library=_user)
    finally:
        del sys.modules["who_lib"]
    assert got["paths"] == {} and got["unnamed"] == 1


def test_the_search_is_bounded_and_hands_the_interpreter_back_in_pieces(monkeypatch):
    arr = np.ones(1)
    big = [[np.ones(1) for _ in range(50)] for _ in range(400)]
    big[399][49] = arr
    _module("who_big", big=big)
    pauses = []
    try:
        got = holders_of([arr], is_library=_user, pause=pauses.append)
        bounded = holders_of([arr], is_library=_user, max_objects=1000)
    finally:
        del sys.modules["who_big"]
    assert got["paths"] == {"who_big.big[…][…]": 1} and got["complete"]
    assert len(pauses) >= got["objects"] // who_holds.CHUNK  # a hand-back every CHUNK of work
    assert not bounded["complete"] and bounded["objects"] == 1000 and bounded["unnamed"] == 1



def test_a_class_attribute_and_a_closure_are_names_too():
    """A cache shared by every instance (a class attribute) and a list a
    step made by a factory appends to (a closure) keep arrays alive as
    often as a global does: named ``who_cls.Cache.store[…]`` and
    ``who_cls.step() closure history[…]``. A class or function the module
    only imported is not its name; the program's code never runs."""
    a, b, c = (np.full(3, i) for i in range(3))
    NEVER.clear()

    def make_step():
        history = [np.ones(1), b]
        hostile = Hostile()

        def step(x):
            history.append(x)
            return hostile

        return step

    step = make_step()
    step.__module__ = "who_cls"
    cache = type("Cache", (), {"__module__": "who_cls", "store": [a], "odd": Hostile()})
    imported = type("Imported", (), {"__module__": "elsewhere", "kept": [c]})
    _module("who_cls", Cache=cache, step=step, Imported=imported)
    try:
        got = holders_of([a, b, c], is_library=_user)
    finally:
        del sys.modules["who_cls"]
    assert got["paths"] == {"who_cls.Cache.store[…]": 1, "who_cls.step() closure history[…]": 1}
    assert got["unnamed"] == 1 and not NEVER
