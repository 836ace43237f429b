"""The dashboard's two small modal screens: help (every key, from the app's
bindings, and what the panels mean) and the last memory profile."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from jaxtop.dashboard.readings import ProfileView
from jaxtop.widgets.render import fmt_bytes

__all__ = ["HELP_NOTES", "HelpScreen", "ProfileScreen"]

#: Shown in help under the keys: what the numbers mean.
# One paragraph per line: the help screen wraps them to its width.
HELP_NOTES = (
    "Memory layers: NVML used ≥ allocator pool ≥ bytes in use ≥ live arrays. "
    "With the default GPU allocator JAX preallocates 75 % of the card: NVML shows "
    "the pool, not what your arrays use. On CPU there is no allocator pool; sizes "
    "come from jax.live_arrays(), and \"in use*\" says so (the * means: counted from live arrays).\n"
    "Memory map: live buffers in address order, one cell per slice of the address range: "
    "█ used, ▓ two thirds or more used, ▒ a third or more, ░ some, · free (a hole), ≈ a long gap left out. "
    "Holes are read only between buffers of 64 KiB or more (smaller ones sit among other heap data). "
    "\"not asked\": buffers whose address only a new Array would tell, one the program would see in "
    "jax.live_arrays() (device_put buffers; every buffer before jaxlib 0.10.1): counted, not placed.\n"
    "Timelines: █ a level held through the column, ░ the range a value moved through within it (a burst "
    "inside a 10 s bucket is ░, not a 10 s block).\n"
    "Transfer bytes are a lower bound (cached jit calls log no shapes). "
    "n/a always comes with the reason.\n"
    "Transfer lines (an agent that names them): the line (train.py:27), the jitted function or jax op called "
    "there, its largest argument and how many more; ~ marks an argument read from a call at that line after "
    "the call (inferred), not seen passing to the device. Python scalars are summed on a line of their own; "
    "transfers not tied to a line are counted apart (unattributed), never guessed. T lists every line.\n"
)


class HelpScreen(ModalScreen[None]):
    """Every key of the app, from its bindings, and what the panels mean."""

    BINDINGS = [Binding("escape,q,question_mark", "dismiss", "close")]
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll { width: 90%; max-width: 100; height: 80%; border: round $accent; background: $surface; padding: 0 1; }
    """

    def __init__(self, rows: list[tuple[str, str, bool]]) -> None:
        """Help listing ``rows``.

        Args:
            rows: One per binding: (its keys as shown, what it does, whether
                it acts with the current source).
        """
        super().__init__()
        self.rows = rows

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(self._render_help(), id="help-text")

    def _render_help(self) -> Group:
        table = Table.grid(padding=(0, 2))
        table.add_column(style="bold", no_wrap=True)
        table.add_column()
        for keys, text, active in self.rows:
            # Keys that do nothing with this source (replay keys in a live
            # view...) stay listed, dimmed.
            table.add_row(keys, text, style=None if active else "dim")
        title = Text.from_markup("[b]jaxtop[/b] — top for JAX memory\n")
        return Group(title, table, Text(""), Text(HELP_NOTES))


class ProfileScreen(ModalScreen[None]):
    """The last device memory profile: file and top allocation sites."""

    BINDINGS = [Binding("escape,q,p", "dismiss", "close")]
    DEFAULT_CSS = """
    ProfileScreen { align: center middle; }
    ProfileScreen > VerticalScroll { width: 95%; height: 85%; border: round $accent; background: $surface; padding: 0 1; }
    """

    def __init__(self, profile: ProfileView | None) -> None:
        super().__init__()
        self.profile = profile

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(self._render_profile(), id="profile-text")

    def _render_profile(self):
        p = self.profile
        if not p:
            return Text("No memory profile yet: press s to take one.", style="dim")
        if p.error:
            return Text(f"Memory profile failed: {p.error}", style="red")
        table = Table(title=f"{p.path}  ·  total {fmt_bytes(p.total_bytes)}", expand=True)
        table.add_column("bytes", justify="right")
        table.add_column("allocs", justify="right")
        table.add_column("allocation site")
        for site in p.top_sites:
            table.add_row(fmt_bytes(site.bytes), "" if site.allocations is None else str(site.allocations), site.site)
        return table
