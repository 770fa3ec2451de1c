"""The KV audit's verdicts: each audited cell's class, and the KV verdict of a probe or a scenario.

Pure functions over what repro.judge.kvaudit measured. repro.judge.verdict names the KV verdicts and
says what each means; the token verdict of a probe never changes because of them. A cell is one
block x layer x K/V plane that a reuse read, against the baseline's KV for the same tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

from repro.judge.verdict import CORRUPT, EXACT, FOREIGN, KV_VERDICTS, MISPLACED, NUMERIC, UNAVAILABLE

# The class of one audited cell (block x layer x K/V plane): exact, numeric, misplaced, foreign, corrupt.
CELL_EXACT, CELL_NUMERIC, CELL_CORRUPT = "e", "n", "c"
CELL_MISPLACED, CELL_FOREIGN = "m", "f"
CELL_CLASSES = (CELL_EXACT, CELL_NUMERIC, CELL_MISPLACED, CELL_FOREIGN, CELL_CORRUPT)
# A cell class -> its name in a reuse's counts.
COUNT_NAMES = {
    CELL_EXACT: "exact",
    CELL_NUMERIC: "numeric",
    CELL_MISPLACED: "misplaced",
    CELL_FOREIGN: "foreign",
    CELL_CORRUPT: "corrupt",
}
# A finding cell's class -> the KV verdict it gives its probe, and the worst first.
FINDING_OF = {CELL_CORRUPT: CORRUPT, CELL_FOREIGN: FOREIGN, CELL_MISPLACED: MISPLACED}


@dataclass(frozen=True)
class Source:
    """What a cell's bytes equal when they are not its own position's: the baseline's block `block` of probe
    `probe` in plane `plane` (exactly, rel 0, or within rel of it), or zeros (probe None)."""

    probe: str | None
    block: int | None = None
    plane: str | None = None
    rel: float = 0.0


def classify_kv_cell(
    identical: bool, rel: float | None, floor_rel: float | None, source: Source | None = None, probe: str = ""
) -> str:
    """One block x layer x plane that a reuse read of `probe`, against the baseline's KV for the same tokens.

    identical: bit-identical. rel: ||loaded - reference|| / ||reference|| (None when it is not a
    finite number, or the reference is all zeros and the loaded plane is not). floor_rel: the
    largest relative error of this arm's own cold prefill against the baseline (None: not measured).
    source: what the loaded bytes equal elsewhere (repro.engine.kvcompare), if anything.
    Exact needs bit-identity; numeric needs a measured floor and an error within it; beyond it the bytes are
    misplaced when they are this prompt's KV from another block or plane and foreign when another prompt's
    (exactly, or within the floor: the same computation's drift), else corrupt (zeros are corrupt)."""
    if identical:
        return CELL_EXACT
    if rel is not None and floor_rel is not None and rel <= floor_rel:
        return CELL_NUMERIC
    known = source is not None and source.probe is not None
    if known and (source.rel == 0.0 or (floor_rel is not None and source.rel <= floor_rel)):
        return CELL_MISPLACED if source.probe == probe else CELL_FOREIGN
    return CELL_CORRUPT


Cell = tuple[int, int, str]  # (block, layer, plane)


@dataclass(frozen=True)
class KVRequestAudit:
    """What the audit saw for one reuse request: its cells' classes, or why it saw nothing. shape: what the
    misplaced and foreign cells' sources say as one sentence (repro.judge.kv_shape), if anything."""

    available: bool
    reason: str | None = None  # why not available
    corrupt: tuple[Cell, ...] = ()  # every corrupt cell
    numeric: int = 0
    exact: int = 0
    misplaced: tuple[Cell, ...] = ()
    foreign: tuple[Cell, ...] = ()
    shape: str | None = None

    def cells(self, cls: str) -> tuple[Cell, ...]:
        return {CELL_CORRUPT: self.corrupt, CELL_FOREIGN: self.foreign, CELL_MISPLACED: self.misplaced}[cls]

    def audited(self) -> int:
        return len(self.corrupt) + len(self.foreign) + len(self.misplaced) + self.numeric + self.exact


@dataclass(frozen=True)
class KVVerdict:
    verdict: str
    reasons: tuple[str, ...]
    blocks: tuple[int, ...] = ()  # blamed blocks (a finding's), and their layers and planes
    layers: tuple[int, ...] = ()
    planes: tuple[str, ...] = ()


def decide_kv_unavailable(reason: str) -> KVVerdict:
    return KVVerdict(UNAVAILABLE, (reason,))


_WHAT = {
    CELL_CORRUPT: "differ from the baseline's KV beyond the measured floor",
    CELL_FOREIGN: "hold another prompt's KV",
    CELL_MISPLACED: "hold this prompt's own KV from another block or plane",
}


def decide_kv_probe(reuses: list[KVRequestAudit] | tuple[KVRequestAudit, ...], floor_rel: float | None) -> KVVerdict:
    """The KV verdict of one probe from its reuse requests' audits: the worst class of any cell (CORRUPT, then
    FOREIGN, then MISPLACED; the blamed blocks are every finding cell's). A finding is a finding even when another
    reuse could not be audited; otherwise any gap makes the probe UNAVAILABLE."""
    if not reuses:
        return decide_kv_unavailable("no reuse request to audit")
    gaps = [f"reuse {i}: {r.reason}" for i, r in enumerate(reuses, start=1) if not r.available]
    gaps += [
        f"reuse {i}: no full block was reused, nothing to audit"
        for i, r in enumerate(reuses, start=1)
        if r.available and not r.audited()
    ]
    found = [c for c in FINDING_OF if any(r.available and r.cells(c) for r in reuses)]
    if found:
        reasons, blamed = [], []
        for i, r in enumerate(reuses, start=1):
            if not r.available:
                continue
            total = r.audited()
            said = [
                f"{len(r.cells(c))} of {total} block x layer x plane cells {_WHAT[c]}" for c in FINDING_OF if r.cells(c)
            ]
            if said:
                shape = f": {r.shape}" if r.shape else ""
                floor = f"floor per layer and plane, at most relative error {_floor(floor_rel)}"
                reasons.append(f"reuse {i}: {'; '.join(said)} ({floor}){shape}")
            blamed += [cell for c in FINDING_OF for cell in r.cells(c)]
        return KVVerdict(
            FINDING_OF[found[0]],
            tuple(reasons + gaps),
            tuple(sorted({b for b, _, _ in blamed})),
            tuple(sorted({layer for _, layer, _ in blamed})),
            tuple(sorted({p for _, _, p in blamed})),
        )
    if gaps:
        return KVVerdict(UNAVAILABLE, tuple(gaps))
    numeric = sum(r.numeric for r in reuses)
    if numeric:
        return KVVerdict(
            NUMERIC,
            (f"{numeric} cells differ from the baseline's KV within the measured floor ({_floor(floor_rel)})",),
        )
    return KVVerdict(EXACT, ())


def _floor(floor_rel: float | None) -> str:
    return "not measured" if floor_rel is None else f"{floor_rel:.3g}"


def decide_scenario_kv(requests: list[tuple[str, KVVerdict]] | tuple[tuple[str, KVVerdict], ...]) -> KVVerdict:
    """A (scenario, arm)'s KV verdict from its audited requests' (label, verdict): the worst finding any has
    (CORRUPT, FOREIGN, MISPLACED; blocks, layers and planes pooled), else UNAVAILABLE when any is or none was
    audited, else NUMERIC when any is, else EXACT."""
    if not requests:
        return decide_kv_unavailable("no request reused a full block to audit")
    by = {k: [(label, v) for label, v in requests if v.verdict == k] for k in KV_VERDICTS}
    for kind in (CORRUPT, FOREIGN, MISPLACED, UNAVAILABLE, NUMERIC):
        if by[kind]:
            reasons = tuple(f"{label}: {r}" for label, v in by[kind] for r in v.reasons)
            hit = [v for _, v in by[kind]]
            return KVVerdict(
                kind,
                reasons,
                tuple(sorted({b for v in hit for b in v.blocks})),
                tuple(sorted({x for v in hit for x in v.layers})),
                tuple(sorted({p for v in hit for p in v.planes})),
            )
    return KVVerdict(EXACT, ())
