"""The matrix page's compact picture: one square per cell x reuse arm x probe, filled by the token verdict
and outlined by the KV verdict, as SVG geometry the template only prints (above the detailed table).

Rows are the table's cells in its order; columns are probes, each a group with one square per reuse arm
in the order the arms are first seen. A square's <title> says the cell, arm, probe and verdicts in words;
an ERROR cell is one bar across its row. The KV findings' outlines are thick: CORRUPT solid black, FOREIGN dotted
reddish purple, MISPLACED dashed bluish green (the heatmap's colours); the key lists FOREIGN and MISPLACED only
on a page that has one. Pure: no I/O."""

from __future__ import annotations

from dataclasses import dataclass

from repro.judge.verdict import (
    CORRUPT,
    ERROR,
    EXACT,
    FAIL,
    FOREIGN,
    INCONCLUSIVE,
    MISPLACED,
    NUMERIC,
    PASS,
    SKIPPED,
    UNAVAILABLE,
)
from repro.publish.heatmap import FOREIGN_FILL, MISPLACED_FILL, Label  # as the KV heatmap draws them

SQUARE, GAP, GROUP_GAP, ROW_GAP = 16, 3, 16, 4
TOP = 22  # room for the probe names
CHAR_W = 7.2  # a label character at the picture's 12 px font, for the left margin
FILLS = {PASS: "#3f9d5d", FAIL: "#c62828", INCONCLUSIVE: "#e0a100", ERROR: "#6a1b9a", SKIPPED: "#b0b7c0"}
NOT_RUN_FILL = "#ffffff"
# (stroke, width, dash): the KV verdict's outline; a probe the audit did not judge keeps a thin grey one.
OUTLINES = {
    CORRUPT: ("#111111", 3.0, ""),
    FOREIGN: (FOREIGN_FILL, 3.0, "1.5 1.5"),
    MISPLACED: (MISPLACED_FILL, 3.0, "4 2"),
    NUMERIC: ("#1e3a8a", 2.0, ""),
    EXACT: ("#9aa3ad", 1.0, ""),
    UNAVAILABLE: ("#6b7280", 1.5, "3 2"),
}
NO_KV = ("#d6dbe1", 1.0, "")


@dataclass(frozen=True)
class Square:
    x: float
    y: float
    w: float
    h: float
    fill: str
    stroke: str
    stroke_width: float
    dash: str
    title: str


@dataclass(frozen=True)
class Swatch:
    fill: str
    stroke: str
    stroke_width: float
    dash: str
    label: str


@dataclass(frozen=True)
class Picture:
    width: int
    height: int
    squares: tuple[Square, ...]
    labels: tuple[Label, ...]
    arms: tuple[str, ...]  # the order of the squares inside a probe's group
    fills: tuple[Swatch, ...]
    outlines: tuple[Swatch, ...]


def _arms(rows) -> tuple[str, ...]:
    seen: list[str] = []
    for row in rows:
        for marks in row.marks:
            seen += [m.arm for m in marks if m.arm not in seen]
    return tuple(seen)


def _square(x: float, y: float, mark, where: str) -> Square:
    stroke, width, dash = OUTLINES.get(mark.kv, NO_KV) if mark.kv else NO_KV
    words = [mark.verdict] + ([f"KV {mark.kv}"] if mark.kv else []) + ([mark.divergence] if mark.divergence else [])
    words += [mark.conditions] if getattr(mark, "conditions", None) else []
    inset = width / 2  # the outline stays inside the square, so neighbours' outlines show
    return Square(
        x + inset, y + inset, SQUARE - width, SQUARE - width, FILLS.get(mark.verdict, NOT_RUN_FILL), stroke, width,
        dash, f"{where}: {', '.join(words)}",
    )  # fmt: skip


def build_picture(page) -> Picture:
    """The picture of a repro.matrix.page.MatrixPage: its rows' marks, probe by probe, arm by arm."""
    arms = _arms(page.rows)
    group = max(1, len(arms)) * (SQUARE + GAP) - GAP
    left = round(max((len(r.name) for r in page.rows), default=4) * CHAR_W) + 10
    squares, labels = [], []
    for pi, probe in enumerate(page.probes):
        labels.append(Label(left + pi * (group + GROUP_GAP) + group / 2, TOP - 8, probe, "middle"))
    for ri, row in enumerate(page.rows):
        y = TOP + ri * (SQUARE + ROW_GAP)
        labels.append(Label(left - 8, y + SQUARE - 3, row.name, "end"))
        if row.error:
            width = len(page.probes) * (group + GROUP_GAP) - GROUP_GAP
            squares.append(Square(left, y, width, SQUARE, FILLS[ERROR], NO_KV[0], 1.0, "", f"{row.name}: {row.error}"))
            continue
        for pi, (probe, marks) in enumerate(zip(page.probes, row.marks)):
            by_arm = {m.arm: m for m in marks}
            for ai, arm in enumerate(arms):
                x = left + pi * (group + GROUP_GAP) + ai * (SQUARE + GAP)
                mark = by_arm.get(arm)
                if mark is None:
                    title = f"{row.name} · {arm} · {probe}: not run"
                    squares.append(
                        Square(x + 0.5, y + 0.5, SQUARE - 1, SQUARE - 1, NOT_RUN_FILL, "#b0b7c0", 1.0, "2 2", title)
                    )
                else:
                    squares.append(_square(x, y, mark, f"{row.name} · {arm} · {probe}"))
    width = left + len(page.probes) * (group + GROUP_GAP)
    height = TOP + len(page.rows) * (SQUARE + ROW_GAP) + 4
    fills = tuple(Swatch(FILLS[v], NO_KV[0], 1.0, "", v) for v in (PASS, FAIL, INCONCLUSIVE, ERROR, SKIPPED))
    fills += (Swatch(NOT_RUN_FILL, "#b0b7c0", 1.0, "2 2", "not run"),)
    seen = {m.kv for row in page.rows for marks in row.marks for m in marks}
    keyed = (CORRUPT, *(v for v in (FOREIGN, MISPLACED) if v in seen), NUMERIC, EXACT, UNAVAILABLE)
    outlines = tuple(Swatch("#ffffff", *OUTLINES[v], f"KV {v}") for v in keyed)
    outlines += (Swatch("#ffffff", *NO_KV, "not audited"),)
    return Picture(int(width), int(height), tuple(squares), tuple(labels), arms, fills, outlines)
