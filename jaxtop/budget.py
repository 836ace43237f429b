"""Moved to :mod:`jaxtop.budgets`: this module re-exports its names until
the last importers use the package."""

from jaxtop.budgets import *  # noqa: F401,F403
from jaxtop.budgets import __all__  # noqa: F401
