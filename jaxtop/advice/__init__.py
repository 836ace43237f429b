"""The advisor: the demo's memory strategies, found in the user's own
program. Records in (:meth:`Advisor.feed`), advice out
(:meth:`Advisor.evaluate`): which line misses which strategy, the evidence
measured over a window, the gain to expect, and the change as code."""

from jaxtop.advice.advisor import WINDOW_S, Advisor
from jaxtop.advice.text import advice_json, headline, report_lines
from jaxtop.advice.types import INFERRED, MEASURED, STRATEGIES, Advice, NotJudged, Report

__all__ = ["INFERRED", "MEASURED", "STRATEGIES", "WINDOW_S", "Advice", "Advisor", "NotJudged", "Report",
           "advice_json", "headline", "report_lines"]
