"""How a report stores an audited reuse's KV grid: per plane (K, V) a class per block x layer, and each cell's max |Δ|
and relative error against the baseline's KV.

Report schema_version 2 wrote both figures for every cell, a row per layer and an entry per block ("dense"). Version
3 writes them only where they are not 0, as runs of adjacent blocks of one layer ("runs"): an EXACT cell is
bit-identical to the baseline's, so repro.engine.kvcompare measures 0 for both (a difference of equal bytes), and a
cell in no run reads as 0. In practice the runs are the cells that are not EXACT; a bit-identical cell whose KV holds
no finite number (its figures are null) is kept in a run too, so the form loses nothing. The class rows, one
character a cell, are the same in both. dense_plane reads either form into version 2's rows; compact_plane writes
version 3's; plane_problems checks a stored plane against the grid's shape.
"""

from __future__ import annotations

from collections.abc import Mapping

FIGURES = ("max_abs", "rel")  # a cell's figures, beside its class
RUN_KEYS = ("first_block", "layer", *FIGURES)
# what a cell in no run holds: the float kvcompare writes for a difference of equal bytes (rounded, it stays 0.0)
ZERO = 0.0


def _zero(value: object) -> bool:
    return isinstance(value, float) and value == ZERO and str(value) == str(ZERO)  # not -0.0, not null


def is_compact(plane: Mapping) -> bool:
    """Whether a stored plane is in runs (version 3) rather than dense rows (version 2)."""
    return "runs" in plane


def compact_plane(classes: list[str], max_abs: list[list], rel: list[list]) -> dict:
    """Version 3's plane from dense rows (a row per layer, an entry per block): the class rows, and a run for each
    stretch of adjacent blocks of a layer where either figure is not 0, layer by layer, blocks in order."""
    runs = []
    for layer, (row_a, row_r) in enumerate(zip(max_abs, rel, strict=True)):
        blank = [_zero(a) and _zero(r) for a, r in zip(row_a, row_r, strict=True)]
        block = 0
        while block < len(blank):
            if blank[block]:
                block += 1
                continue
            start = block
            while block < len(blank) and not blank[block]:
                block += 1
            runs.append(
                {"layer": layer, "first_block": start, "max_abs": row_a[start:block], "rel": row_r[start:block]}
            )
    return {"class": list(classes), "runs": runs}


def dense_plane(plane: Mapping) -> Mapping:
    """A stored plane in either form as version 2's dense rows: class, max_abs and rel, a row per layer (a dense
    plane is returned as it is)."""
    if not is_compact(plane):
        return plane
    classes = list(plane["class"])
    rows = {key: [[ZERO] * len(row) for row in classes] for key in FIGURES}
    for run in plane["runs"]:
        for key in FIGURES:
            row = rows[key][run["layer"]]
            row[run["first_block"] : run["first_block"] + len(run[key])] = run[key]
    return {"class": classes, **rows}


def dense_planes(planes: Mapping | None) -> dict:
    """An audit's planes (K and V) as dense rows, whichever form the report stored; {} when it has none."""
    if not isinstance(planes, Mapping):
        return {}
    return {name: dense_plane(p) if isinstance(p, Mapping) else p for name, p in planes.items()}


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _figures(values: object, n: int) -> bool:
    return (
        isinstance(values, list)
        and len(values) == n
        and all(v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)) for v in values)
    )


def run_problems(runs: object, layers: int, blocks: int) -> list[str]:
    """What is wrong with a plane's runs (version 3): each a layer and first block inside the grid, a max_abs and
    rel list of one length (at least 1) that stays inside the layer's row, in order, none overlapping another."""
    if not isinstance(runs, list):
        return ["runs must be a list"]
    end = (-1, 0)  # (layer, first block after the last run)
    for i, run in enumerate(runs):
        if not isinstance(run, dict) or set(run) != set(RUN_KEYS):
            return [f"runs[{i}] must have exactly {', '.join(RUN_KEYS)}"]
        layer, first, n = run["layer"], run["first_block"], len(run["rel"]) if isinstance(run["rel"], list) else -1
        if not (_count(layer) and _count(first) and layer < layers and n >= 1 and first + n <= blocks):
            return [f"runs[{i}] lies outside the grid of {layers} layers x {blocks} blocks"]
        if not all(_figures(run[key], n) for key in FIGURES):
            return [f"runs[{i}]: max_abs and rel must be lists of {n} numbers or nulls"]
        if (layer, first) < end:
            return [f"runs[{i}] overlaps or precedes the run before it (layer by layer, blocks in order)"]
        end = (layer, first + n)
    return []
