"""The shape of a reuse's misplaced and foreign KV: which slot holds which block, said as one sentence.

Pure: the input is one audited reuse's cells (repro.judge.kvaudit classes them) with what each misplaced or
foreign cell's bytes equal (a repro.judge.kv_verdict.Source). A slot is a block the reuse read, numbered from
the prompt's start. A slot most of whose finding cells name one source block (of one probe, in any plane)
holds that block; runs of slots whose sources step by one (forwards: a shift, backwards: a reversal) are said
together. For a prompt's own blocks the sentence also says what the reused prefix then holds: a permutation
of its own blocks (attention reads the same set of keys and values, each with the rotary position it was
computed at), blocks from beyond the prefix, a block twice, or a block missing (docs/kv-audit.md says which
shapes attention is invariant to).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from repro.judge.kv_verdict import CELL_FOREIGN, CELL_MISPLACED, Source
from repro.judge.wording import span_text


@dataclass(frozen=True)
class SlotSource:
    """What slot `slot` holds: block `block` of probe `probe` (this request's own prompt when own)."""

    slot: int
    probe: str
    block: int
    own: bool
    planes_swapped: bool  # K where V belongs, or V where K does


def slot_sources(
    cells: dict[tuple[int, int, str], tuple[str, Source | None]], probe: str
) -> tuple[list[SlotSource], set[int]]:
    """Each slot's source: the block most of its misplaced or foreign cells (block, layer, plane) -> (class,
    source) name, when more than half of them do. A block of repeated tokens can equal another block of the same
    text in one layer's V (no position in it there), so a cell or two may name another; the deeper layers, whose
    KV carries the context, name one block. Returns the sources and the slots with finding cells that name none
    (corrupt, or no majority)."""
    by_slot: dict[int, Counter] = {}
    swapped: dict[tuple[int, str, int], bool] = {}
    found: set[int] = set()
    for (slot, _layer, plane), (cls, src) in cells.items():
        found.add(slot)
        if cls not in (CELL_MISPLACED, CELL_FOREIGN) or src is None or src.probe is None or src.block is None:
            by_slot.setdefault(slot, Counter())[None] += 1
            continue
        by_slot.setdefault(slot, Counter())[(src.probe, src.block)] += 1
        key = (slot, src.probe, src.block)
        swapped[key] = swapped.get(key, False) or (src.plane is not None and src.plane != plane)
    out = []
    for slot in sorted(by_slot):
        (best, n), total = by_slot[slot].most_common(1)[0], sum(by_slot[slot].values())
        if best is not None and 2 * n > total:
            p, b = best
            out.append(SlotSource(slot, p, b, p == probe, swapped[(slot, p, b)]))
    return out, found - {s.slot for s in out}


def _runs(sources: list[SlotSource]) -> list[list[SlotSource]]:
    """Consecutive slots of one probe whose blocks step by +1 or -1 (or stay: the plane swapped in place)."""
    runs: list[list[SlotSource]] = []
    for s in sources:
        last = runs[-1] if runs else None
        if last and s.slot == last[-1].slot + 1 and s.probe == last[-1].probe:
            step = s.block - last[-1].block
            want = (last[1].block - last[0].block) if len(last) > 1 else step
            if step == want and step in (-1, 0, 1):
                last.append(s)
                continue
        runs.append([s])
    return runs


def _blocks(run: list[SlotSource]) -> str:
    first, last = run[0].block, run[-1].block
    if len(run) == 1:
        return f"block {first}"
    if first == last:
        return f"block {first} each"
    sep = "…" if first > last else "–"
    return f"blocks {first}{sep}{last}"


def _say_run(run: list[SlotSource]) -> str:
    slots = run[0].slot, run[-1].slot
    where = f"slot {slots[0]} holds" if len(run) == 1 else f"slots {slots[0]}–{slots[1]} hold"
    if all(s.own and s.block == s.slot and s.planes_swapped for s in run):
        return f"{where} {'its' if len(run) == 1 else 'their'} own KV with K and V exchanged"
    whose = "this prompt's" if run[0].own else f"{run[0].probe}'s"
    text = f"{where} {whose} {_blocks(run)}"
    if len(run) > 1 and run[1].block < run[0].block:
        text += " in reverse"
    elif run[0].block != run[0].slot and len(run) > 1 and run[1].block == run[0].block + 1:
        text += f" (shifted by {run[0].block - run[0].slot:+d})"
    elif run[0].block == run[0].slot and not run[0].own:
        text += " (the same positions)"
    if all(s.planes_swapped for s in run):
        text += ", K and V exchanged"
    return text


def prefix_holds(sources: list[SlotSource], num_blocks: int, unknown: set[int] = frozenset()) -> list[str]:
    """What the reused prefix of num_blocks slots holds of this prompt's own blocks, where some are misplaced. A slot
    whose cells name no source (unknown) holds something else: no permutation, and no block counted missing."""
    own = {s.slot: s.block for s in sources if s.own and not (s.block == s.slot and s.planes_swapped)}
    if not own:
        return []
    foreign = {s.slot for s in sources if not s.own}
    held = [own.get(slot, slot) for slot in range(num_blocks) if slot not in foreign and slot not in unknown]
    said = []
    beyond = sorted(b for b in held if b >= num_blocks)
    twice = sorted(b for b, n in Counter(held).items() if n > 1)
    missing = [] if unknown else sorted(set(range(num_blocks)) - set(held) - foreign)
    if not beyond and not twice and not missing and not foreign and not unknown:
        said.append("a permutation of its own blocks")
    if beyond:
        said.append(f"{len(beyond)} block(s) from beyond the reused prefix ({span_text(beyond)})")
    if twice:
        said.append(f"block(s) {span_text(twice)} twice")
    if missing:
        said.append(f"block(s) {span_text(missing)} missing")
    return said


def describe(cells: dict[tuple[int, int, str], tuple[str, Source | None]], probe: str, num_blocks: int) -> str | None:
    """One sentence for a reuse's misplaced and foreign blocks (None when it has none that name one source)."""
    sources, unknown = slot_sources(cells, probe)
    if not sources:
        return None
    text = "; ".join(_say_run(run) for run in _runs(sources))
    holds = prefix_holds(sources, num_blocks, unknown)
    if holds:
        text += f"; the reused prefix then holds {', '.join(holds)}"
    return text
