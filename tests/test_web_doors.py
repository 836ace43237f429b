"""The connection bound of ``jaxtop serve`` (jaxtop/dashboard/web_doors.py),
pure: real sockets, a clock of the test's."""

from __future__ import annotations

import socket
from types import SimpleNamespace

import pytest

from jaxtop.dashboard.web_doors import GRACE_S, Doors


def _pair() -> socket.socket:
    a, b = socket.socketpair()
    _pair.keep.append(b)  # the peer stays open
    return a


_pair.keep = []


def test_at_the_bound_the_oldest_idle_stranger_makes_room_and_the_owner_stays():
    now = [0.0]
    said = []
    doors = Doors(limit=3, say=said.append, clock=lambda: now[0])
    owner, a, b = _pair(), _pair(), _pair()
    for conn in (owner, a, b):
        doors.admit(conn)
    doors.trust(SimpleNamespace(get_extra_info=lambda key: owner))
    now[0] = GRACE_S - 0.1
    with pytest.raises(ConnectionAbortedError):  # nobody is past the grace: refused
        doors.admit(_pair())
    now[0] = GRACE_S + 0.1
    doors.admit(_pair())  # a, the oldest stranger, was closed for it
    assert a.recv(1) == b"" and doors.closed == 1 and doors.refused == 1
    assert owner.fileno() != -1 and doors.open_count() == 3
    assert len(said) == 1  # once per burst


def test_closed_connections_leave_the_count():
    doors = Doors(limit=2, say=lambda line: None)
    a, b = _pair(), _pair()
    doors.admit(a)
    doors.admit(b)
    a.close()
    doors.admit(_pair())
    assert doors.open_count() == 2 and doors.refused == 0
