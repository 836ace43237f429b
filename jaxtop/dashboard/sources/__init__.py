"""Where records come from: live agents, a recording, or code. One code path
feeds the model either way; each source runs its own thread (or the caller's)
and never touches the UI."""

from jaxtop.dashboard.sources.base import OnUpdate, Source
from jaxtop.dashboard.sources.live import LiveSource
from jaxtop.dashboard.sources.push import PushSource
from jaxtop.dashboard.sources.replay import ReplaySource

__all__ = ["LiveSource", "OnUpdate", "PushSource", "ReplaySource", "Source"]
