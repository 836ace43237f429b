"""What a log line on stderr looks like, for the stderr relay (probes/_relay.py).

The relay runs as ``python -S -E _relay.py``, with this file's directory first
on ``sys.path``: this module imports nothing but ``re``. Two header forms are
recognised: abseil's ``W1202 18:34:30.919532    2146 guard_lib.cc:125] ``
(jaxlib 0.7 and later) and TSL's ``2026-12-03 19:09:21.852989: W
external/xla/...cc:108] `` (older jaxlib, logging through XLA/TSL).
"""

import re

# -- what a log line looks like ---------------------------------------------------
# [^\S\n] (a space that is not a newline) keeps a match inside one line.
_SP = rb"[^\S\n]"
_FILE_LINE = rb"[^\s]+:\d+\] "
# abseil (jaxlib >= 0.7): severity, MMDD, time, thread id, file:line.
_ABSEIL = rb"[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+" + _SP + rb"+\d+" + _SP + rb"+" + _FILE_LINE
# TSL (older jaxlib): date, time, severity, an optional thread id, file:line.
_TSL = rb"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IWEF](?:" + _SP + rb"+\d+)?" + _SP + rb"+" + _FILE_LINE
_HEADER = rb"(?:" + _ABSEIL + rb"|" + _TSL + rb")"
_DIRECTIONS = rb"(?:host-to-device|device-to-device|device-to-host) transfer:"
#: A whole guard line anywhere; group 1 is the message, which the agent parses.
GUARD_RE = re.compile(_HEADER + rb"(" + _DIRECTIONS + rb"[^\n]*)\n")
#: The same, only where a line starts: the common case, and a faster scan.
LINE_START_GUARD_RE = re.compile(rb"^" + GUARD_RE.pattern, re.M)
#: A guard line the program's end cut short of its newline.
GUARD_AT_END_RE = re.compile(_HEADER + rb"(" + _DIRECTIONS + rb"[^\n]*)\Z")
#: Any log line anywhere, for when some of them are dropped: group 1 or 2 is
#: the severity letter, group 3 the message of a guard line (None otherwise).
LOG_LINE_RE = re.compile(
    rb"(?:([IWEF])" + _ABSEIL[6:] + rb"|" + _TSL.replace(rb"[IWEF]", rb"([IWEF])", 1) + rb")"
    rb"(?:(" + _DIRECTIONS + rb"[^\n]*)|[^\n]*)\n"
)
#: A guard message after some other log header ("...] host-to-device
#: transfer: ..."): a format this relay does not know (a newer or patched
#: jaxlib). Reported as "U <line>" so the agent says n/a instead of 0.
UNKNOWN_GUARD_RE = re.compile(rb"[^\n]*\] " + _DIRECTIONS + rb"[^\n]*")
UNKNOWN_REPORTS_MAX = 5
#: When and on which thread each guard line was written, read from its header
#: (abseil: time and thread id; TSL: time, and a thread id where it has one).
#: Groups: abseil's time and thread, or TSL's time and thread; then the
#: direction's two words' first letters.
STAMP_RE = re.compile(
    rb"(?:[IWEF]\d{4} (\d\d:\d\d:\d\d\.\d+)" + _SP + rb"+(\d+)" + _SP + rb"+" + _FILE_LINE
    + rb"|\d{4}-\d\d-\d\d (\d\d:\d\d:\d\d\.\d+): [IWEF](?:" + _SP + rb"+(\d+))?" + _SP + rb"+" + _FILE_LINE + rb")"
    rb"(h|d)\w*-to-(h|d)\w* transfer:"
)
#: The same for abseil's header at a line's start only (jaxlib >= 0.7, no
#: partial line of the program's before it): the common case, scanned in a
#: third of the time (the unanchored form tries both headers at every byte).
#: Groups: the time's hour and minute (``HH:MM:``), its seconds, the
#: thread, the direction's two words' first letters.
_LINE_START_ABSEIL = rb"^[IWEF]\d{4} (\d\d:\d\d:)(\d\d\.\d+)" + _SP + rb"+(\d+)" + _SP + rb"+" + _FILE_LINE
LINE_START_STAMP_RE = re.compile(_LINE_START_ABSEIL + rb"(h|d)\w*-to-(h|d)\w* transfer:", re.M)
#: A whole guard line with abseil's header at a line's start, everything
#: the relay takes from it in one scan (the common case: jaxlib >= 0.7, no
#: partial line of the program's before it). Groups: the time's ``HH:MM:``,
#: its seconds, the thread, the message (as :data:`GUARD_RE`'s), the
#: direction's words.
LINE_START_ABSEIL_GUARD_RE = re.compile(
    _LINE_START_ABSEIL + rb"((host-to-device|device-to-device|device-to-host) transfer:[^\n]*)\n", re.M)
#: Direction codes in a stamp report, by the direction's words.
WORDS_DIRECTION = {b"host-to-device": b"h2d", b"device-to-device": b"d2d", b"device-to-host": b"d2h"}
#: Direction codes in a stamp report: the first letters of its two words.
_STAMP_DIRECTION = {(b"h", b"d"): b"h2d", (b"d", b"h"): b"d2h", (b"d", b"d"): b"d2d"}
#: Stamps kept per read at most (a flood is still counted by ``G``).
STAMPS_PER_READ_MAX = 20000
# Every guard line holds this; bytes without it hold none (a memchr-fast test).
_GUARD_MARK = b" transfer:"
# Every log header ends with it.
_HEADER_END = b"] "


def _beginning(first, tokens, rest):
    """A pattern for any non-empty beginning of ``first tokens... rest``.

    Args:
        first: the first character's class.
        tokens: ``(whole, part)`` pairs in order; ``part`` matches any
            beginning of ``whole`` (empty included), loosely: holding a
            little too much only delays bytes, holding too little splits a
            guard line.
        rest: the rest of the line.
    """
    pattern = rest
    for whole, part in reversed(tokens):
        pattern = rb"(?:" + whole + pattern + rb"|" + part + rb")"
    return first + pattern


# After a whole header: the beginning of a guard message, or any message
# when other log lines may be dropped too (the user silenced a severity).
_GUARD_REST = rb"(?:" + _DIRECTIONS + rb"[^\n]*|[a-z :-]{0,25})"
_ANY_REST = rb"[^\n]*"


def _partial_line_re(rest):
    abseil = _beginning(rb"[IWEF]", [
        (rb"\d{4}", rb"\d{0,3}"),
        (rb" ", rb""),
        (rb"\d\d:\d\d:\d\d", rb"[\d:]{0,7}"),
        (rb"\.\d+", rb"\.?"),
        (_SP + rb"+\d+" + _SP + rb"+", _SP + rb"*\d*"),
        (_FILE_LINE, rb"[^\s]*"),
    ], rest)
    tsl = _beginning(rb"\d", [
        (rb"\d{3}", rb"\d{0,2}"),
        (rb"-\d\d-\d\d", rb"[\d-]{0,5}"),
        (rb" ", rb""),
        (rb"\d\d:\d\d:\d\d", rb"[\d:]{0,7}"),
        (rb"\.\d+", rb"\.?"),
        (rb": ", rb":?"),
        (rb"[IWEF]", rb""),
        (rb"(?:" + _SP + rb"+\d+)?" + _SP + rb"+", _SP + rb"*\d*"),
        (_FILE_LINE, rb"[^\s]*"),
    ], rest)
    return re.compile(rb"(?:" + abseil + rb"|" + tsl + rb")\Z")


#: The end of a block that may be the first bytes of a guard line whose rest
#: is still on its way (the read ended inside it) ...
PARTIAL_GUARD_RE = _partial_line_re(_GUARD_REST)
#: ... or of any log line, when the user silenced a severity.
PARTIAL_LOG_RE = _partial_line_re(_ANY_REST)
#: Without a whole header (which ends in "] ", and a guard line's then holds
#: " transfer:"), a partial log line starts within this many bytes of the
#: end (a header is under 100 bytes, even with a long file path): so only
#: that much of a long unfinished line, a progress bar redrawn with \r for
#: minutes, is scanned for one, at about 100 ns a byte.
PARTIAL_HEADER_MAX = 512
#: How far back a partial line with a whole header is looked for.
PARTIAL_MAX = 65536

DIRECTION_KEYS = {
    b"host-to-device": "h2d",
    b"device-to-device": "d2d",
    b"device-to-host": "d2h",
}
