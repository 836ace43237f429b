"""All Textual messages of the dashboard."""

from __future__ import annotations

from textual.message import Message

from jaxtop.dashboard.model import Snapshot


class SnapshotReady(Message):
    """A fresh frozen snapshot of the model, built off the UI thread.

    ``can_replace``: when the screen is slow, only the newest snapshot is
    kept in the queue, so the UI never falls behind the stream.
    """

    def __init__(self, snapshot: Snapshot) -> None:
        super().__init__()
        self.snapshot = snapshot

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, SnapshotReady)
