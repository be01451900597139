"""The batch page's graph: server-rendered SVG (no script, no external asset), one node per
ref linking to its run, coloured by status with the dashboard's status classes, an arrow
per dependency inside the batch (dashed while the dependency has not succeeded)."""

from __future__ import annotations

import re
import uuid
from collections.abc import Collection, Sequence
from urllib.parse import quote

from markupsafe import Markup, escape

from api.ui.graph_layout import NODE_H, NODE_W, layout
from runyard.domain.graph import MAX_BATCH_RUNS
from runyard.submission.batches import BatchRun

REF_CHARS = 21  # what fits on a node's first line
LINE_CHARS = 25  # and on its second
_DIGITS = re.compile(r"(\d+)")


def natural_key(ref: str) -> tuple[tuple[int, int | str], ...]:
    """``#2`` before ``#10``: digit runs compare as numbers."""
    return tuple(
        (1, int(part)) if part.isdigit() else (0, part) for part in _DIGITS.split(ref) if part
    )


def ordered(runs: Sequence[BatchRun]) -> list[BatchRun]:
    """A batch's runs in the order the page shows them (refs, numbers as numbers)."""
    return sorted(runs, key=lambda run: natural_key(run.ref))


def ref_anchor(ref: str) -> str:
    """The id of a ref's row on the batch page (a fragment a link can name)."""
    return f"ref-{ref}"


def ref_link(batch_id: uuid.UUID, ref: str) -> str:
    """The batch page, at the ref's row (default refs start with ``#``)."""
    return f"/ui/batches/{batch_id}#{quote(ref_anchor(ref), safe='')}"


def _clip(text: str, longest: int) -> str:
    return text if len(text) <= longest else text[: longest - 1] + "…"


def _node_title(run: BatchRun, scheduled: bool, outside: int) -> str:
    parts = [f"{run.ref}: {run.tool}, {run.status}"]
    if scheduled:
        parts.append("scheduled")
    if run.error_code:
        parts.append(run.error_code)
    if outside:
        parts.append(f"depends on {outside} run(s) outside the batch")
    return "; ".join(parts)


def batch_graph(
    runs: Sequence[BatchRun],
    scheduled: Collection[uuid.UUID] = (),
    *,
    graph_id: str = "batch-graph",
    limit: int = MAX_BATCH_RUNS,
) -> Markup:
    """The graph of a batch's runs (the first ``limit`` in page order): SVG at its natural
    size, for a box that scrolls."""
    shown = ordered(runs)[:limit]
    refs = {run.ref for run in shown}
    drawn = layout([(run.ref, [d for d in run.depends_on if d in refs]) for run in shown])
    by_ref = {run.ref: run for run in shown}
    succeeded = {run.ref for run in shown if run.status == "succeeded"}
    parts = [
        f'<svg class="graph" id="{graph_id}" width="{drawn.width}" height="{drawn.height}" '
        f'viewBox="0 0 {drawn.width} {drawn.height}" role="group" '
        f'aria-labelledby="{graph_id}-t" aria-describedby="{graph_id}-d" '
        'xmlns="http://www.w3.org/2000/svg">',
        f'<title id="{graph_id}-t">Dependency graph of the batch</title>',
        f'<desc id="{graph_id}-d">{len(shown)} runs in {drawn.layers} layers, dependencies '
        "on the left; each run links to its page"
        f"{f' (the first {limit} of {len(runs)})' if len(runs) > limit else ''}</desc>",
        f'<defs><marker id="{graph_id}-arrow" viewBox="0 0 8 8" refX="8" refY="4" '
        'markerWidth="8" markerHeight="8" orient="auto-start-reverse">'
        '<path class="arrowhead" d="M0,0 L8,4 L0,8 z"/></marker></defs>',
        '<g class="edges">',
    ]
    for dep, name in drawn.edges:
        a, b = drawn.boxes[dep], drawn.boxes[name]
        x1, y1 = a.x + NODE_W, a.y + NODE_H / 2
        x2, y2 = b.x, b.y + NODE_H / 2
        bend = max(abs(x2 - x1) / 2, 24)
        state = "met" if dep in succeeded else "pending"
        parts.append(
            f'<path class="edge {state}" d="M{x1},{y1:g} C{x1 + bend:g},{y1:g} '
            f'{x2 - bend:g},{y2:g} {x2},{y2:g}" marker-end="url(#{graph_id}-arrow)">'
            f"<title>{escape(name)} depends on {escape(dep)}</title></path>"
        )
    parts.append('</g><g class="nodes">')
    for ref, box in drawn.boxes.items():
        run = by_ref[ref]
        later = run.run_id in scheduled and run.status == "queued"
        outside = sum(1 for d in run.depends_on if d not in refs)
        second = f"{run.status}{' · scheduled' if later else ''} · {run.tool}"
        parts.append(
            f'<a href="/ui/runs/{run.run_id}" class="node s-{escape(run.status)}" '
            f'data-ref="{escape(ref)}">'
            f"<title>{escape(_node_title(run, later, outside))}</title>"
            f'<rect class="box" x="{box.x}" y="{box.y}" width="{NODE_W}" height="{NODE_H}" '
            'rx="6"/>'
            f'<rect class="stripe" x="{box.x}" y="{box.y}" width="6" height="{NODE_H}" rx="3"/>'
            f'<text class="ref" x="{box.x + 14}" y="{box.y + 18}">{escape(_clip(ref, REF_CHARS))}'
            "</text>"
            f'<text class="what" x="{box.x + 14}" y="{box.y + 35}">'
            f"{escape(_clip(second, LINE_CHARS))}</text></a>"
        )
    parts.append("</g></svg>")
    return Markup("".join(parts))
