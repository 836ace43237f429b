"""Moved to :mod:`jaxtop.budgets.pytest_plugin`: this name stays while the
``pytest11`` entry point names it.

Both names are one module object, so that the plugin's hooks, fixture and
session state exist once whichever name pytest loads.
"""

import sys

from jaxtop.budgets import pytest_plugin as _plugin

sys.modules[__name__] = _plugin
