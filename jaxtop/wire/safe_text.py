"""Text that came from a program, a recording or a server, made safe to show
on a terminal.

A program's argv, a ``jaxtop.label`` name, a jitted function's name, the file
that allocated a buffer, an exception's message and a Prometheus label value
are all chosen by someone else: the program being watched, whoever wrote a
recording or a census file, or whatever answers on a port. Printed raw, an
escape sequence among them is obeyed by the terminal: OSC 0 sets the window
title, OSC 52 writes the clipboard, CSI 6n makes the terminal type a reply
into the next command, ``ESC [2J`` clears the screen, and the same go as C1
controls (U+0080-U+009F) without an ESC. Bidirectional overrides
(U+202A-U+202E, U+2066-U+2069) reorder what is shown around them. A lone
surrogate (U+D800-U+DFFF, which JSON can spell as an escape) is no
character at all: printing it raises UnicodeEncodeError.

:func:`terminal_safe` shows each such character as its escape
(``\\x1b``, ``\\x9b``, ``\\u202e``): visible, never interpreted. Newlines and
tabs stay (exception messages have them; they move the cursor only as text
does). :func:`safe_record` does it for every string of a decoded record;
the record decoder (:mod:`jaxtop.wire.records.decoder`) applies it to each
line whose bytes hold such a character or its escape, so every screen,
``snapshot``, ``replay`` and ``attach`` draw only safe text, and the
commands that print without the model (``ls``, ``oom``, ``export`` to a
terminal, Prometheus errors) call :func:`terminal_safe` themselves.

Standard library only.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["UNSAFE", "safe_record", "terminal_safe"]

#: C0 controls but tab and newline, DEL, C1 controls, bidi overrides/isolates, lone surrogates.
UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def _visible(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def terminal_safe(text: str) -> str:
    """``text`` with every control character shown as its escape (see the
    module); the same object when there is none (the usual case)."""
    if UNSAFE.search(text) is None:
        return text
    return UNSAFE.sub(_visible, text)


def safe_record(value: Any) -> Any:
    """``value`` (a decoded JSON value) with :func:`terminal_safe` applied to
    every string in it, keys included.

    Returns:
        ``value`` itself when nothing needed changing; otherwise a copy of
        the containers on the way to what changed (the input is not
        modified: a caller may keep the original record).
    """
    cls = value.__class__
    if cls is str:
        return terminal_safe(value)
    if cls is dict:
        out = None
        for key, item in value.items():
            new_item = safe_record(item) if item.__class__ in (str, dict, list) else item
            new_key = terminal_safe(key) if key.__class__ is str else key
            if new_item is not item or new_key is not key:
                if out is None:
                    out = dict(value)
                if new_key is not key:
                    out.pop(key, None)
                out[new_key] = new_item
        return value if out is None else out
    if cls is list:
        out_list = None
        for i, item in enumerate(value):
            if item.__class__ in (str, dict, list):
                new_item = safe_record(item)
                if new_item is not item:
                    if out_list is None:
                        out_list = list(value)
                    out_list[i] = new_item
        return value if out_list is None else out_list
    return value
