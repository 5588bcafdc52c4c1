"""A small inline SVG: pattern prevalence per task family and outcome (no script, no library, no network).

For each task family (rows) and pattern type (columns), two bars: the share of failed cells and of
successful cells of that family with at least one pattern of that type. Shares, not counts, so a
family with many successful runs does not look worse for having more of them.
"""

from __future__ import annotations

from typing import Any

from markupsafe import Markup, escape

Row = dict[str, Any]

_ROW_H = 22
_LABEL_W = 210
_COL_W = 150
_BAR_W = 120
COLOURS = {"failed": "#b3261e", "successful": "#1d7a3a"}


def prevalence(cells: list[Row], patterns_by_cell: dict[str, list[Row]]) -> dict[str, Any]:
    """Task -> type -> outcome -> (cells with the type, cells); and the sorted tasks and types."""
    types = sorted({str(p.get("type")) for rows in patterns_by_cell.values() for p in rows})
    tasks = sorted({str(c.get("task_id")) for c in cells})
    table: dict[str, dict[str, dict[str, list[int]]]] = {}
    for c in cells:
        outcome = str(c.get("outcome"))
        if outcome not in COLOURS:
            continue
        task = str(c.get("task_id"))
        present = {str(p.get("type")) for p in patterns_by_cell.get(str(c["cell_id"]), [])}
        for t in types:
            slot = table.setdefault(task, {}).setdefault(t, {}).setdefault(outcome, [0, 0])
            slot[1] += 1
            slot[0] += t in present
    return {"tasks": tasks, "types": types, "table": table}


def prevalence_svg(cells: list[Row], patterns_by_cell: dict[str, list[Row]]) -> Markup | None:
    """The chart as inline SVG markup, or None when there are no patterns or no outcomes."""
    p = prevalence(cells, patterns_by_cell)
    if not p["types"] or not p["table"]:
        return None
    tasks, types, table = p["tasks"], p["types"], p["table"]
    width = _LABEL_W + _COL_W * len(types)
    height = 40 + _ROW_H * len(tasks) + 24
    out = [
        f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
        f'width="{width}" height="{height}" role="img" aria-label="pattern prevalence per task family and outcome">'
    ]
    for i, t in enumerate(types):
        x = _LABEL_W + i * _COL_W
        out.append(f'<text x="{x}" y="16" class="h">{escape(t)}</text>')
        out.append(f'<line x1="{x}" y1="24" x2="{x}" y2="{height - 20}" class="g"/>')
    for j, task in enumerate(tasks):
        y = 30 + j * _ROW_H
        out.append(f'<text x="{_LABEL_W - 8}" y="{y + 13}" text-anchor="end">{escape(task)}</text>')
        for i, t in enumerate(types):
            x = _LABEL_W + i * _COL_W
            for k, outcome in enumerate(("failed", "successful")):
                have, n = table.get(task, {}).get(t, {}).get(outcome, [0, 0])
                share = have / n if n else 0.0
                w = round(_BAR_W * share, 1)
                title = f"{task} · {t} · {outcome}: {have} of {n} cells" if n else f"{task} · {outcome}: no cells"
                out.append(
                    f'<rect x="{x + 2}" y="{y + 2 + k * 9}" width="{max(w, 0.5) if n else 0}" height="8" '
                    f'fill="{COLOURS[outcome]}"><title>{escape(title)}</title></rect>'
                )
                if n:
                    out.append(f'<text x="{x + 6 + w}" y="{y + 9 + k * 9}" class="s">{have}/{n}</text>')
    ly = height - 6
    out.append(f'<rect x="{_LABEL_W}" y="{ly - 8}" width="10" height="8" fill="{COLOURS["failed"]}"/>')
    out.append(f'<text x="{_LABEL_W + 14}" y="{ly}" class="s">failed cells</text>')
    out.append(f'<rect x="{_LABEL_W + 100}" y="{ly - 8}" width="10" height="8" fill="{COLOURS["successful"]}"/>')
    out.append(
        f'<text x="{_LABEL_W + 114}" y="{ly}" class="s">successful cells (share with ≥1 pattern of the type)</text>'
    )
    out.append("</svg>")
    return Markup("".join(out))
