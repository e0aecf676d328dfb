"""``report.md``: the report for a reader, leading with the result, from ``report.json``'s data.

The first screen answers how much faster, with what settings, at what cost, how far from the
limit and what next; the timeline follows, then one row per knob trial with its verdict, the
diagnoses of the final settings with their evidence, every window with its role, and last the
notes that nothing above says. Rendered from the JSON data alone (``report_view``), so
``maxtp report DIR`` re-renders the file a fit wrote.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import fields
from typing import Any

from lightning_maxtp.observe.report_rows import TrialRow
from lightning_maxtp.observe.report_view import ReportView, Summary, report_view
from lightning_maxtp.observe.window import CaptureSummary

__all__ = ["PNG_MISSING", "render_markdown"]

PNG_MISSING = "timeline.png not written"
"""How a note that the plot failed starts (the link to it is left out then)."""


def render_markdown(data: Mapping[str, Any]) -> str:
    """``report.md``'s text for ``report.json``'s data.

    Args:
        data: ``ThroughputReport.to_dict()``, or ``report.json`` read back.

    Returns:
        The markdown, ending with a newline.
    """
    view = report_view(data)
    md = ["# Throughput report", "", *_summary(view.summary), ""]
    if not any(n.startswith(PNG_MISSING) for n in view.notes):
        md += ["![timeline](timeline.png)", ""]
    md += _trials(view)
    md += _diagnoses(data.get("diagnoses") or [])
    md += _windows(view)
    if view.changes:
        md += ["## Knob changes", ""]
        for c in view.changes:
            at = f"t={c.t_s:.1f} s" if c.step is None else f"step {c.step} (t={c.t_s:.1f} s)"
            md.append(f"- {at} {c.knob}: {c.old} -> {c.new} {c.reason}".rstrip())
        md.append("")
    captures = data.get("captures") or []
    if captures:
        md += ["## Captures", "", *(f"- {_capture(c)}" for c in captures), ""]
    ranks = data.get("ranks") or []
    if ranks:
        md += ["## Ranks (last window)", "", "```", json.dumps(ranks[-1]), "```", ""]
    if view.notes:
        md += ["## Notes", "", *(f"- {n}" for n in view.notes), ""]
    return "\n".join(md).rstrip("\n") + "\n"


def _summary(s: Summary) -> list[str]:
    """The summary block: the throughput line, then one bullet per question."""
    unit = "samples/s per rank" if s.world_size > 1 else "samples/s"
    speedup = s.speedup
    if s.tuned and s.before is not None and s.after is not None and speedup is not None:
        where = (
            ""
            if s.baseline_steps is None
            else f" (steps {s.baseline_steps[0]}-{s.baseline_steps[1]})"
        )
        lines = [
            f"**Throughput: {s.before:.1f} -> {s.after:.1f} {unit} ({speedup:.2f}x)** - your "
            f"settings' baseline window{where} against the {s.steps_in_force} steps measured "
            "under the settings in force"
            + (
                ""
                if s.changed
                else "; no setting changed, so the difference is the job's own (warm-up, caches, "
                "other load), not tuning's"
            ),
            "",
        ]
    else:
        why = "tuning measured no baseline" if s.tuned else "no tuning ran: nothing was changed"
        lines = [f"**Throughput: {s.rate_text}** under your settings ({why})", ""]
    if s.tuned:
        lines.append(f"- **Settings in force:** {_settings(s)}")
        lines.append(f"- **Tuning cost:** {_cost(s)}")
        if s.fit_s is not None and s.baseline_fit_s is not None and s.net is not None:
            saved = s.saved_s or 0.0
            net = (
                f"- **Net:** the fit's {s.steps_run} steps took {s.fit_s:.1f} s against "
                f"{s.baseline_fit_s:.1f} s at the baseline rate"
            )
            if s.changed:
                net += f": {abs(saved):.1f} s {'saved' if saved >= 0 else 'lost'} ({s.net:.2f}x)"
            else:  # the settings are the user's: whatever differs is not tuning's doing
                net += f" ({s.net:.2f}x); no setting changed, so tuning saved nothing"
            lines.append(net)
    lines.append(
        f"- **Bottleneck: `{s.bottleneck}`** - {s.rate_text}, median step "
        f"{s.median_step_s * 1e3:.1f} ms, data wait {s.data_wait_share:.0%}"
        + (" (under the final settings)" if s.tuned else "")
    )
    if s.limit:
        lines.append(f"- **Distance to the limit:** {s.limit}")
    if s.next:
        lines += ["- **Next:**", *(f"    - {n}" for n in s.next)]
    else:
        lines.append(f"- **Next:** nothing recommended for the `{s.bottleneck}` bottleneck")
    return lines


def _settings(s: Summary) -> str:
    changed = ", ".join(f"{c.knob} {c.yours} -> {c.now}" for c in s.changed)
    same = ", ".join(f"{knob}={value}" for knob, value in s.unchanged)
    parts = [f"changed: {changed}" if changed else "all as you set them"]
    if changed and same:
        parts.append(f"as you set them: {same}")
    elif same:
        parts[0] += f" ({same})"
    return "; ".join(parts)


def _cost(s: Summary) -> str:
    cost = "not measured" if s.cost_s is None else f"{s.cost_s:.1f} s"
    budget = " (no budget)" if s.budget_s is None else f" of a {s.budget_s:.1f} s budget"
    if s.budget_s is not None and s.earned_s > 0:
        budget += f" + {s.earned_s:.1f} s already saved by the changes kept"
    if s.over_s > 0.05:  # noise-level overshoots are not news
        budget += f" (OVER BUDGET by {s.over_s:.1f} s)"
    text = (
        f"{cost}{budget} (training blocked {s.blocked_s:.1f} s, slower windows {s.lost_s:.1f} s, "
        f"switching {s.switch_s:.1f} s); {s.trials} trial(s), {s.kept} kept"
    )
    if s.tuning_s is not None:
        text += f", in {s.tuning_s:.1f} s over {s.tuning_steps} real training steps"
    if s.stop_reason:
        text += f"; stopped: {s.stop_reason}"
    if not s.finished:
        text += " (tuning had not ended when the fit did)"
    return text


def _cell(value: Any) -> str:
    """A value for a markdown table cell (a ``|`` or a line break would end the cell)."""
    return str(value).replace("|", "\\|").replace("\n", " ")


def _trials(view: ReportView) -> list[str]:
    if not view.summary.tuned:
        return []
    md = ["## Trials", ""]
    if not view.trials:
        stop = view.summary.stop_reason
        return [*md, f"No knob was tried{': ' + stop if stop else ''}.", ""]
    md += [
        "| # | step | t (s) | knob | from -> to | samples/s before -> after | change | "
        "predicted | verdict | evidence |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    md += [_trial_row(t) for t in view.trials]
    return [*md, ""]


def _trial_row(t: TrialRow) -> str:
    after = "not measured" if t.after is None else f"{t.after:.1f}"
    change = "-" if t.after is None else f"{t.gain:+.1%}"
    predicted = "-" if t.predicted is None else f"{t.predicted:+.0%}"
    at = "-" if t.t_s is None else f"{t.t_s:.1f}"
    cells = [
        t.number, t.step, at, t.knob, f"{t.old} -> {t.new}", f"{t.before:.1f} -> {after}",
        change, predicted, t.verdict, t.evidence,
    ]  # fmt: skip
    return "| " + " | ".join(_cell(c) for c in cells) + " |"


def _diagnoses(diagnoses: Sequence[Mapping[str, Any]]) -> list[str]:
    md: list[str] = []
    for d in diagnoses:
        md += [f"## {d.get('kind')} (confidence {float(d.get('confidence') or 0):.2f})", ""]
        md += [str(d.get("summary", "")), ""]
        evidence = {k: v for k, v in (d.get("evidence") or {}).items() if v is not None}
        if evidence:
            md += ["| evidence | value |", "|---|---|"]
            md += [f"| {k} | {_cell(v)} |" for k, v in evidence.items()]
            md.append("")
        recs = d.get("recommendations") or []
        for i, r in enumerate(recs, 1):
            mode = "auto: same math, the loop may apply it" if r.get("auto_apply") else "opt-in"
            md.append(
                f"{i}. `{r.get('knob')}`: {r.get('current')} -> {r.get('proposed')} - "
                f"{r.get('reason')} ({mode})"
            )
        if recs:
            md.append("")
    return md


def _windows(view: ReportView) -> list[str]:
    if not view.windows:
        return []
    md = [
        "## Windows",
        "",
        "| steps | t (s) | role | samples/s | median step ms | data wait | GPU util | MFU | GC |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for w in view.windows:
        at = "-" if w.start_s is None or w.end_s is None else f"{w.start_s:.1f}-{w.end_s:.1f}"
        util = "-" if w.gpu_util_percent is None else f"{w.gpu_util_percent:.0f} %"
        mfu = "-" if not w.counted else "error" if w.mfu is None else f"{w.mfu:.0%}"
        gc = "-" if w.gc_share is None else f"{w.gc_share:.0%}"
        md.append(
            f"| {w.first_step}-{w.last_step} | {at} | {_cell(w.role)} | {w.samples_per_s:.1f} | "
            f"{w.median_step_s * 1e3:.1f} | {w.data_wait_share:.0%} | {util} | {mfu} | {gc} |"
        )
    return [*md, ""]


def _capture(data: Mapping[str, Any]) -> str:
    """A capture in words (as ``CaptureSummary`` says it; its raw data when it cannot be read)."""
    names = {f.name for f in fields(CaptureSummary)}
    try:
        return str(CaptureSummary(**{k: v for k, v in data.items() if k in names}))
    except (TypeError, ValueError):
        return json.dumps(dict(data))
