"""Advice as text: the lines ``jaxtop advise`` and ``jaxtop snapshot`` print
and the Advice screen draws, and as JSON (``jaxtop advise --json``)."""

from __future__ import annotations

from typing import Any

from jaxtop.advice.types import Advice, Report

__all__ = ["advice_json", "headline", "report_lines"]


def headline(advice: Advice) -> str:
    """One line: ``placement train.py:55: put what `step` is fed on the device ahead of the call``."""
    return f"{advice.strategy} {advice.where}: {advice.title}"


def advice_lines(advice: Advice, rank: int | None = None) -> list[str]:
    """One piece of advice, as a block of lines."""
    head = f"{rank}. " if rank is not None else ""
    where = advice.where
    if advice.function:
        where += f" in {advice.function}"
    if advice.jitted:
        where += f" ({advice.jitted})"
    return [
        f"{head}[{advice.strategy}] {where}: {advice.title}  ({advice.basis})",
        f"   evidence: {advice.evidence}",
        f"   gain:     {advice.gain}",
        f"   fix:      {advice.fix}",
    ]


def report_lines(report: Report, not_judged: bool = True) -> list[str]:
    """The whole report: the advice, highest expected gain first, then what
    could not be judged."""
    if report.t is None:
        return ["advice: n/a (no sample yet)"]
    lines = [f"advice over the last {report.span_s:.0f} s of samples (window {report.window_s:.0f} s): "
             f"{len(report.advice) or 'none'}"]
    for i, advice in enumerate(report.advice, 1):
        lines += advice_lines(advice, i)
    if not_judged and report.not_judged:
        lines.append("not judged:")
        lines += [f"   {n.strategy}: n/a ({n.why})" for n in report.not_judged]
    return lines


def advice_json(report: Report) -> dict[str, Any]:
    """The report as a JSON document: ``advice`` a list of objects with
    ``strategy``, ``file``, ``line``, ``function``, ``jitted``, ``evidence``,
    ``gain``, ``fix``, ``basis``, ``title``, ``window_s``, ``score``."""
    return {
        "t": report.t,
        "window_s": report.window_s,
        "span_s": report.span_s,
        "advice": [{
            "strategy": a.strategy, "file": a.file, "line": a.line, "function": a.function, "jitted": a.jitted,
            "where": a.where, "title": a.title, "evidence": a.evidence, "gain": a.gain, "fix": a.fix,
            "basis": a.basis, "window_s": round(a.window_s, 3), "score": round(a.score, 4),
        } for a in report.advice],
        "not_judged": [{"strategy": n.strategy, "why": n.why} for n in report.not_judged],
    }
