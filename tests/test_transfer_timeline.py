"""Guard lines to calls in bulk (probes/transfer_timeline.py): the pure layer.

The probe's behaviour on whole programs is in tests/test_transfer_sites.py
and, against JAX's own guard, tests/test_transfer_sites_oracle.py.
"""

from __future__ import annotations

import gc
import sys
import weakref

import numpy as np

from jaxtop.probes.transfer_timeline import KeyTable, Timeline, file_calls, tie


def test_a_note_filed_late_goes_between_the_notes_of_its_time():
    """The slow path's notes come from another queue than the fast path's:
    one filed after later notes of its thread still ties the line before it."""
    tl = Timeline()
    tl.add_keys([1.0, 2.0, 3.0], ["a", "a", "a"])
    tl.add_keys([1.5], [None], {0: ("s", "slow", None, None)})
    assert tl.times.tolist() == [1.0, 1.5, 2.0, 3.0]
    credits, too_far, after = tie(tl, [1.2, 1.7, 2.5, 3.5], window=3.0)
    assert sorted((str(note), n, calls) for note, _, n, calls in credits) == [
        ("('s', 'slow', None, None)", 1, 1), ("a", 2, 2)]
    assert too_far == 0 and after.tolist() == [3.5]


def test_rare_notes_keep_their_values_when_a_late_note_sorts_in_before_them():
    tl = Timeline()
    tl.add_keys([1.0, 2.0, 3.0], ["a", None, None], {1: ("d", 2), 2: ("d", 3)})
    tl.add_keys([1.5, 2.5], [None, "b"], {0: ("s", 1.5)})
    assert tl.times.tolist() == [1.0, 1.5, 2.0, 2.5, 3.0]
    assert [tl.value(i) for i in range(5)] == ["a", ("s", 1.5), ("d", 2), "b", ("d", 3)]


def test_lines_of_one_call_count_once_as_a_call_and_trimming_keeps_the_rare_notes_right():
    tl = Timeline()
    tl.add_keys([1.0, 2.0, 3.0, 4.0], ["a", None, "b", None], {1: ("d", 1), 3: ("d", 2)})
    tl.trim(1.5)  # the first note let go: positions move, the rare notes with them
    assert tl.base == 1 and tl.value(0) == ("d", 1) and tl.value(2) == ("d", 2)
    credits, _, _ = tie(tl, [2.5, 2.6, 2.7], window=3.0)
    assert [(note, n, calls) for note, _, n, calls in credits] == [("b", 3, 1)]


def test_a_line_whose_next_note_is_too_late_is_not_tied():
    tl = Timeline()
    tl.add_keys([10.0], ["a"])
    credits, too_far, after = tie(tl, [1.0, 9.5], window=3.0)
    assert too_far == 1 and [(note, n) for note, _, n, _ in credits] == [("a", 1)] and after.size == 0


def test_a_filed_note_keeps_no_jitted_function_alive():
    """A jitted function holds its executables: the agent must not be what keeps one."""

    class Jitted:
        def __call__(self):
            return None

    fun = Jitted()
    ref = weakref.ref(fun)
    code = sys._getframe().f_code
    table = KeyTable()
    ((ident, times, codes, extras, funs, code_objects),) = file_calls([(7, 0.5, fun, code, 12)], 100.0, table)
    assert (ident, times.tolist(), extras) == (7, [100.5], None)
    assert [table.keys[c] for c in codes] == [(id(fun), id(code), 12)]
    tl = Timeline(table)
    tl.add(times, codes, extras)
    del fun, funs
    gc.collect()
    assert ref() is None


def test_notes_of_several_threads_are_filed_apart():
    table = KeyTable()
    filed = file_calls([(1, 0.1, "f", None, -1), (2, 0.2, "g", None, -1), (1, 0.3, "f", None, -1, ("x",))], 0.0, table)
    by_thread = {ident: (times.tolist(), codes.tolist(), extras) for ident, times, codes, extras, _, _ in filed}
    assert by_thread[1][0] == [0.1, 0.3] and by_thread[1][1][1] == -1 and by_thread[1][2] == {
        1: ("d", id("f"), None, -1, ("x",))}
    assert by_thread[2][0] == [0.2] and table.keys[by_thread[1][1][0]] == (id("f"), id(None), -1)


def test_the_key_table_forgets_what_no_note_names_and_the_notes_keep_their_keys():
    table = KeyTable()
    one, two = Timeline(table), Timeline(table)
    one.add_keys([1.0, 2.0, 3.0], ["gone", "a", None], {2: ("d", 1)})
    two.add_keys([1.5, 2.5], ["b", "gone too"])
    one.trim(1.5), two.trim(2.0)
    table.compact([one, two])
    assert sorted(table.keys) == ["a", "gone too"]  # "gone" and "b": no note names them now
    assert [one.value(i) for i in range(2)] == ["a", ("d", 1)] and two.value(0) == "gone too"
    assert table.intern(["a", "c", None]).tolist() == [table.keys.index("a"), 2, -1]


def test_a_batch_of_one_site_gets_one_code_and_any_other_site_in_it_its_own():
    """The one-site batch is told by identity: two code objects that compare
    equal (the same source exec'd twice) and a function whose == says yes to
    everything are still other sites."""

    class EqualToAll:
        def __eq__(self, other):
            return True

        __hash__ = object.__hash__

    src = "def step():\n    pass\n"
    first, second = ({}, {})
    exec(compile(src, "loop.py", "exec"), first)
    exec(compile(src, "loop.py", "exec"), second)
    code_a, code_b = first["step"].__code__, second["step"].__code__
    assert code_a == code_b and code_a is not code_b
    f, g = EqualToAll(), EqualToAll()
    table = KeyTable()
    same = [(1, 0.1 * i, f, code_a, 8) for i in range(5)]
    ((_, _, codes, _, funs, code_objects),) = file_calls(same, 0.0, table)
    assert codes.tolist() == [0] * 5 and table.keys == [(id(f), id(code_a), 8)]
    assert list(funs.values()) == [f] and list(code_objects.values()) == [code_a]
    for other in ((1, 0.6, g, code_a, 8), (1, 0.6, f, code_b, 8), (1, 0.6, f, code_a, 10)):
        ((_, _, codes, _, funs, _),) = file_calls(same + [other], 0.0, table)
        assert codes.tolist()[:5] == [0] * 5 and codes[5] != 0
        assert table.keys[codes[5]] == (id(other[2]), id(other[3]), other[4]) and len(funs) == 1 + (other[2] is g)
