"""The KV audit's verdicts: each audited cell's class, and the KV verdict of a probe or a scenario.

Pure functions over what repro.judge.kvaudit measured. repro.judge.verdict names the KV verdicts and
says what each means; the token verdict of a probe never changes because of them. A cell is one
block x layer x K/V plane that a reuse read, against the baseline's KV for the same tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

from repro.judge.verdict import CORRUPT, EXACT, KV_VERDICTS, NUMERIC, UNAVAILABLE

# The class of one audited cell (block x layer x K/V plane): exact, numeric, corrupt.
CELL_EXACT, CELL_NUMERIC, CELL_CORRUPT = "e", "n", "c"


def classify_kv_cell(identical: bool, rel: float | None, floor_rel: float | None) -> str:
    """One block x layer x plane that a reuse read, against the baseline's KV for the same tokens.

    identical: bit-identical. rel: ||loaded - reference|| / ||reference|| (None when it is not a
    finite number, or the reference is all zeros and the loaded plane is not). floor_rel: the
    largest relative error of this arm's own cold prefill against the baseline (None: not measured).
    Exact needs bit-identity; numeric needs a measured floor and an error within it; else corrupt."""
    if identical:
        return CELL_EXACT
    if rel is not None and floor_rel is not None and rel <= floor_rel:
        return CELL_NUMERIC
    return CELL_CORRUPT


@dataclass(frozen=True)
class KVRequestAudit:
    """What the audit saw for one reuse request: its cells' classes, or why it saw nothing."""

    available: bool
    reason: str | None = None  # why not available
    corrupt: tuple[tuple[int, int, str], ...] = ()  # (block, layer, plane) of every corrupt cell
    numeric: int = 0
    exact: int = 0


@dataclass(frozen=True)
class KVVerdict:
    verdict: str
    reasons: tuple[str, ...]
    blocks: tuple[int, ...] = ()  # blamed blocks (CORRUPT only), and their layers and planes
    layers: tuple[int, ...] = ()
    planes: tuple[str, ...] = ()


def decide_kv_unavailable(reason: str) -> KVVerdict:
    return KVVerdict(UNAVAILABLE, (reason,))


def decide_kv_probe(reuses: list[KVRequestAudit] | tuple[KVRequestAudit, ...], floor_rel: float | None) -> KVVerdict:
    """The KV verdict of one probe from its reuse requests' audits. A corrupt cell is a finding even
    when another reuse could not be audited; otherwise any gap makes the probe UNAVAILABLE."""
    if not reuses:
        return decide_kv_unavailable("no reuse request to audit")
    corrupt = [c for r in reuses if r.available for c in r.corrupt]
    gaps = [f"reuse {i}: {r.reason}" for i, r in enumerate(reuses, start=1) if not r.available]
    gaps += [
        f"reuse {i}: no full block was reused, nothing to audit"
        for i, r in enumerate(reuses, start=1)
        if r.available and not (r.corrupt or r.numeric or r.exact)
    ]
    if corrupt:
        reasons = []
        for i, r in enumerate(reuses, start=1):
            if r.available and r.corrupt:
                total = len(r.corrupt) + r.numeric + r.exact
                reasons.append(
                    f"reuse {i}: {len(r.corrupt)} of {total} block x layer x plane cells differ from the baseline's KV "
                    f"beyond the measured floor (relative error {_floor(floor_rel)})"
                )
        return KVVerdict(
            CORRUPT,
            tuple(reasons + gaps),
            tuple(sorted({b for b, _, _ in corrupt})),
            tuple(sorted({layer for _, layer, _ in corrupt})),
            tuple(sorted({p for _, _, p in corrupt})),
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
    """A (scenario, arm)'s KV verdict from its audited requests' (label, verdict): CORRUPT when any is
    (blocks, layers and planes pooled), else UNAVAILABLE when any is or none was audited, else NUMERIC
    when any is, else EXACT."""
    if not requests:
        return decide_kv_unavailable("no request reused a full block to audit")
    by = {k: [(label, v) for label, v in requests if v.verdict == k] for k in KV_VERDICTS}
    for kind in (CORRUPT, UNAVAILABLE, NUMERIC):
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
