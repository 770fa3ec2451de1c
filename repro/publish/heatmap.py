"""The KV audit's heatmap on the report page: one reuse request's cells (blocks across, layers down,
a K and a V panel) and the page's legend, as SVG geometry the template only prints.

Fill is the cell's relative error against the baseline's KV on a log scale (LOG_MIN..LOG_MAX), in
blue for a numeric cell (within the arm's measured floor) and orange to dark red for a corrupt
one, which is also outlined; an exact cell is neutral grey, and a corrupt cell whose error is not
a finite number takes the darkest red. The other findings take one colour each whatever their error, from a
palette colour-blind readers tell apart (Okabe-Ito), and an outline of their own: a misplaced cell (this
prompt's own KV from another block or plane) bluish green with a dashed outline, a foreign cell (another
prompt's KV) reddish purple with a dotted one. Blocks a planted fault corrupted on purpose are framed by
a dashed band. Every cell has a <title>; the caption says the same in words. The legend shows the misplaced
and foreign keys only on a page that has such cells. Pure: no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from repro.judge.kv_verdict import (
    CELL_CLASSES,
    CELL_CORRUPT,
    CELL_EXACT,
    CELL_FOREIGN,
    CELL_MISPLACED,
    CELL_NUMERIC,
    COUNT_NAMES,
)
from repro.judge.wording import blocks_text, number, spans
from repro.readmodel import Request, floor_rel_text
from repro.readmodel.requests import match_text

LOG_MIN, LOG_MAX = -8, 0  # 1e-8 .. 1: the float32 floor sits near the left, a zeroed block (rel 1) at the right
EXACT_FILL = "#d5d9df"
NUMERIC_RAMP = ((125, 180, 250), (30, 58, 138))  # blue: even the lightest stands apart from the grey of exact
CORRUPT_RAMP = ((253, 186, 116), (127, 29, 29))  # orange to dark red
MISPLACED_FILL = "#009e73"  # Okabe-Ito bluish green: apart from the blue ramp, the grey and the reds
FOREIGN_FILL = "#cc79a7"  # Okabe-Ito reddish purple
FLAT_FILLS = {CELL_MISPLACED: MISPLACED_FILL, CELL_FOREIGN: FOREIGN_FILL}
# The outlined cells' css (the template draws each one's outline: kv-c solid, kv-m dashed, kv-f dotted).
FINDING_CSS = {CELL_CORRUPT: "kv-c", CELL_MISPLACED: "kv-m", CELL_FOREIGN: "kv-f"}
OUTLINE = "#111111"
PLANTED_STROKE = "#7c3aed"
LABEL_W = 74  # room for "K · layer 27"
TOP = 18  # room for the block numbers
PANEL_GAP = 14
CLASS_NAMES = dict(COUNT_NAMES)
# What each finding class is, in the legend.
LEGEND_WORDS = {
    CELL_MISPLACED: "misplaced: this prompt's own KV from another block or plane (dashed outline)",
    CELL_FOREIGN: "foreign: another prompt's KV (dotted outline)",
}


@dataclass(frozen=True)
class Rect:
    x: float
    y: float
    w: float
    h: float
    fill: str
    css: str  # kv-e, kv-n, kv-c, kv-m, kv-f (the last three outlined), planted, swatch
    title: str


@dataclass(frozen=True)
class Label:
    x: float
    y: float
    text: str
    anchor: str  # start, middle, end


@dataclass(frozen=True)
class Heatmap:
    anchor: str
    label: str
    width: int
    height: int
    cells: tuple[Rect, ...]
    bands: tuple[Rect, ...]  # planted blocks, drawn over the cells
    labels: tuple[Label, ...]
    caption: str
    counts: str
    classes: tuple[str, ...] = ()  # the cell classes it draws (repro.judge.kv_verdict.CELL_CLASSES order)


@dataclass(frozen=True)
class Legend:
    width: int
    height: int
    cells: tuple[Rect, ...]
    labels: tuple[Label, ...]


def _mix(ramp: tuple[tuple[int, int, int], tuple[int, int, int]], t: float) -> str:
    lo, hi = ramp
    return "#" + "".join(f"{round(a + (b - a) * t):02x}" for a, b in zip(lo, hi))


def _position(rel: float | None) -> float:
    """Where a relative error sits on the log scale, 0..1; None (not finite) is the top."""
    if rel is None or not math.isfinite(rel):
        return 1.0
    if rel <= 0:
        return 0.0
    return min(1.0, max(0.0, (math.log10(rel) - LOG_MIN) / (LOG_MAX - LOG_MIN)))


def cell_fill(cls: str, rel: float | None) -> str:
    if cls == CELL_EXACT:
        return EXACT_FILL
    if cls in FLAT_FILLS:
        return FLAT_FILLS[cls]
    return _mix(NUMERIC_RAMP if cls == CELL_NUMERIC else CORRUPT_RAMP, _position(rel))


def _sizes(num_blocks: int, layers: int) -> tuple[int, int]:
    width = max(5, min(16, 900 // max(1, num_blocks)))
    height = 12 if layers <= 8 else 8 if layers <= 32 else 5
    return width, height


def _tick_step(cell_w: int) -> int:
    """Block numbers at least 36 px apart, at a round step."""
    for step in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000):
        if step * cell_w >= 36:
            return step
    return 2000


@dataclass(frozen=True)
class _Panel:
    """What every cell of one plane's panel shares."""

    plane: str
    top: int
    first: int  # the prompt block of the first column
    cw: int
    ch: int
    block_size: int | None
    matches: dict  # (layer, plane, block) -> what the cell's bytes equal
    planted: frozenset

    def title(self, layer: int, a: int, b: int, what: str) -> str:
        return f"{self.plane} · layer {layer} · {blocks_text(list(range(a, b + 1)), self.block_size)}: {what}"


def _row_rects(panel: _Panel, layer: int, row: str, rel: list, max_abs: list) -> list[Rect]:
    """One layer of one plane; runs of exact cells are one rect (a page of many layers stays small)."""
    rects, b, y = [], 0, panel.top + layer * panel.ch
    while b < len(row):
        cls, x, block = row[b], LABEL_W + b * panel.cw, panel.first + b
        if cls == CELL_EXACT:
            end = b
            while end + 1 < len(row) and row[end + 1] == CELL_EXACT:
                end += 1
            title = panel.title(layer, block, panel.first + end, "exact (bit-identical to the baseline's KV)")
            rects.append(Rect(x, y, (end - b + 1) * panel.cw, panel.ch, EXACT_FILL, "kv-e", title))
            b = end + 1
            continue
        r = rel[b] if b < len(rel) else None
        what = f"{CLASS_NAMES.get(cls, cls)} · rel {'not finite' if r is None else number(r)}"
        what += f" · max abs {number(max_abs[b] if b < len(max_abs) else None)}"
        if (layer, panel.plane, block) in panel.matches:
            said = panel.matches[(layer, panel.plane, block)]
            what += f" · bytes {said}" if said.startswith("nearest ") else f" · bytes equal {said}"
        if block in panel.planted:
            what += " · planted fault"
        title = panel.title(layer, block, block, what)
        if cls in FINDING_CSS:  # inset, so the outline stays inside the cell and its neighbours' outlines show
            rects.append(Rect(x + 0.5, y + 0.5, panel.cw - 1, panel.ch - 1, cell_fill(cls, r), FINDING_CSS[cls], title))
        else:
            rects.append(Rect(x, y, panel.cw, panel.ch, cell_fill(cls, r), "kv-n", title))
        b += 1
    return rects


def build_heatmap(request: Request, *, label: str, anchor: str, floor: object, block_size: int | None) -> Heatmap:
    """The heatmap of one audited reuse request (its kv_audit has status "audited")."""
    audit = request.kv_audit
    first, num_blocks, layers = int(audit.get("first_block")), int(audit.get("num_blocks")), int(audit.get("layers"))
    cw, ch = _sizes(num_blocks, layers)
    planted = frozenset(request.planted_blocks)
    matches = {(m.get("layer"), m.get("plane"), m.get("block")): match_text(m) for m in audit.matches}
    cells, bands, labels = [], [], []
    step = _tick_step(cw)
    labels += [
        Label(LABEL_W + b * cw + cw / 2, TOP - 6, str(first + b), "middle")
        for b in range(num_blocks)
        if (first + b) % step == 0
    ]
    panel_h = layers * ch
    label_every = 1 if layers <= 16 else 4
    for pi, plane in enumerate(("K", "V")):
        panel = _Panel(plane, TOP + pi * (panel_h + PANEL_GAP), first, cw, ch, block_size, matches, planted)
        grid = audit.planes[plane]
        for layer in range(layers):
            cells += _row_rects(panel, layer, str(grid["class"][layer]), grid["rel"][layer], grid["max_abs"][layer])
            if layer % label_every == 0:
                labels.append(Label(LABEL_W - 4, panel.top + (layer + 1) * ch - 2, f"{plane} · layer {layer}", "end"))
        for a, z in spans([b - first for b in planted if first <= b < first + num_blocks]):
            title = f"planted fault: {blocks_text(list(range(first + a, first + z + 1)), block_size)}"
            x, w = LABEL_W + a * cw - 1.5, (z - a + 1) * cw + 3
            bands.append(Rect(x, panel.top - 2.5, w, panel_h + 5, "none", "planted", title))
    counts = audit.counts
    total = sum(v for v in counts.values() if isinstance(v, int))
    drawn = {c for plane in ("K", "V") for row in audit.planes[plane]["class"] for c in str(row)}
    # misplaced and foreign are named where there are some (a report written before them has no such count)
    named = [c for c in CELL_CLASSES if c not in FLAT_FILLS or counts.get(COUNT_NAMES[c])]
    return Heatmap(
        anchor=anchor,
        label=label,
        width=LABEL_W + num_blocks * cw + 6,
        height=TOP + 2 * panel_h + PANEL_GAP + 4,
        cells=tuple(cells),
        bands=tuple(bands),
        labels=tuple(labels),
        caption=(
            f"planted: {blocks_text(sorted(planted), block_size)}; "
            f"blamed: {blocks_text(audit.blamed_blocks, block_size)}; {floor_rel_text(floor)}"
        ),
        counts=(
            " · ".join(f"{counts.get(COUNT_NAMES[c], 0)} {COUNT_NAMES[c]}" for c in named)
            + f" of {total} cells (block × layer × plane)"
            + (f"; KV {audit.get('origin')}ly loaded" if audit.get("origin") in ("external", "local") else "")
        ),
        classes=tuple(c for c in CELL_CLASSES if c in drawn),
    )


def build_legend(classes: tuple[str, ...] | frozenset[str] | set[str] = ()) -> Legend:
    """The colour scale (log relative error, numeric and corrupt), the exact colour, the outline and the band;
    then a key for each of misplaced and foreign that `classes` (the cell classes the page draws) holds."""
    steps, sw, x0 = 16, 18, 170
    cells, labels = [], []
    for row, (cls, name) in enumerate(
        ((CELL_NUMERIC, "numeric (within the floor)"), (CELL_CORRUPT, "corrupt (outlined)"))
    ):
        y = 4 + row * 22
        labels.append(Label(x0 - 8, y + 12, name, "end"))
        for i in range(steps):
            rel = 10 ** (LOG_MIN + (LOG_MAX - LOG_MIN) * (i + 0.5) / steps)
            css = "kv-c" if cls == CELL_CORRUPT else "kv-n"
            cells.append(Rect(x0 + i * sw, y, sw, 16, cell_fill(cls, rel), css, f"{name}: rel ≈ {rel:.1e}"))
    for exp in range(LOG_MIN, LOG_MAX + 1, 2):
        text = "≥ 1" if exp == LOG_MAX else f"1e{exp}"
        labels.append(Label(x0 + (exp - LOG_MIN) / (LOG_MAX - LOG_MIN) * steps * sw, 60, text, "middle"))
    labels.append(Label(x0 + steps * sw + 10, 28, "relative error against the baseline's KV,", "start"))
    labels.append(Label(x0 + steps * sw + 10, 40, "log scale; not a finite number = darkest", "start"))
    y = 72
    cells.append(Rect(x0, y, sw * 2, 16, EXACT_FILL, "kv-e", "exact: bit-identical to the baseline's KV"))
    labels.append(Label(x0 + sw * 2 + 6, y + 12, "exact (bit-identical)", "start"))
    cells.append(Rect(x0 + 170, y - 2, sw * 2, 20, "none", "planted", "planted fault"))
    labels.append(Label(x0 + 170 + sw * 2 + 8, y + 12, "blocks a planted fault corrupted", "start"))
    for cls in (c for c in (CELL_MISPLACED, CELL_FOREIGN) if c in classes):
        y += 24
        words = LEGEND_WORDS[cls]
        cells.append(Rect(x0 + 0.5, y + 0.5, sw * 2 - 1, 15, FLAT_FILLS[cls], FINDING_CSS[cls], words))
        labels.append(Label(x0 + sw * 2 + 6, y + 12, words, "start"))
    return Legend(width=x0 + steps * sw + 330, height=y + 22, cells=tuple(cells), labels=tuple(labels))
