"""The KV audit of a P→D consumer: whose blocks it loaded, from digests of the blocks it received.

Pure: the input is one consumer request's received blocks as digests (one per block slot the transfer wrote, from
the prompt's first external block on; None where the audit could not read a block) and the cache-off reference's
blocks as digests for every prompt the run sent (its computed full blocks). A digest covers a block's K and V in
every layer, so two digests are equal only where the bytes are bit for bit.

Each slot is named by what its bytes equal, in the verifier's cell classes (repro.judge.kv_verdict.classify_kv_cell):
this prompt's block at that position (exact), this prompt's block at another position (misplaced; a block it shares
with another prompt from the start is its own, as the verifier's source prefers), a block of another prompt only
(foreign: "slots 0–12 hold probe-a's blocks 0–12", the sentence repro.judge.kv_shape says for the verifier's
audit), or nothing known. Nothing known is never called corrupt here: a block that is numerically near the
reference but not bit-identical (a producer and a reference are two processes) equals no digest either, and only
the floor comparison of the verifier's audit (repro.engine.kvcompare) can tell drift from garbage; such slots make
the request UNAVAILABLE with that reason, unless some other slot already names a foreign or misplaced block, which
stands on its own (bit-equal to a known block is positive identification). The KV verdict sits beside the token
verdict and never changes it; the exit code reads both (a probe request's KV finding is exit 1, as on every arm:
repro.disagg.report.exit_view).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from repro.judge.kv_shape import describe
from repro.judge.kv_verdict import CELL_FOREIGN, CELL_MISPLACED, Source, classify_kv_cell
from repro.judge.verdict import EXACT, FOREIGN, MISPLACED, UNAVAILABLE

_PLANE = "K"  # a digest covers both planes and every layer: one cell per slot, shown as layer 0, K


@dataclass(frozen=True)
class PdKvAudit:
    """One consumer request's received blocks, named."""

    verdict: str  # EXACT, MISPLACED, FOREIGN or UNAVAILABLE
    reason: str | None = None
    slots: tuple[tuple[int, str | None, int | None], ...] = ()  # (slot, prompt, block): None, None: nothing known
    shape: str | None = None  # "slots 0–12 hold probe-a's blocks 0–12"

    @property
    def loaded_from(self) -> tuple[str, ...]:
        """The other prompts whose blocks it loaded, in slot order."""
        out: list[str] = []
        for _, prompt, _ in self.slots:
            if prompt is not None and prompt not in out:
                out.append(prompt)
        return tuple(out)

    def as_dict(self) -> dict:
        return {
            "verdict": self.verdict,
            "reason": self.reason,
            "slots": [list(s) for s in self.slots],
            "shape": self.shape,
        }


def reference_index(reference: Mapping[str, Sequence[str]]) -> dict[str, tuple[tuple[str, int], ...]]:
    """Each reference block's digest -> every (prompt, block) that has it, in the mapping's order (two prompts share
    a digest where they share the tokens from the start)."""
    index: dict[str, list[tuple[str, int]]] = {}
    for prompt, digests in reference.items():
        for block, digest in enumerate(digests):
            index.setdefault(digest, []).append((prompt, block))
    return {digest: tuple(found) for digest, found in index.items()}


def source_of(index: Mapping[str, Sequence[tuple[str, int]]], digest: str, prompt: str) -> Source | None:
    """What a received block's bytes equal, this prompt's own block first (a shared prefix's block is the prompt's
    own, as repro.engine.kvcompare.ReferenceIndex.source prefers it for the verifier), bit for bit (rel 0)."""
    hits = index.get(digest) or ()
    hit = next((h for h in hits if h[0] == prompt), None) or (hits[0] if hits else None)
    return None if hit is None else Source(hit[0], hit[1], _PLANE, 0.0)


def name_loaded_blocks(
    prompt: str, received: Sequence[str | None] | None, first_slot: int, reference: Mapping[str, Sequence[str]]
) -> PdKvAudit:
    """`prompt` the request's own prompt; `received` the digests of the blocks the transfer wrote (None: the
    audit saw no transfer); `first_slot` the first of them (the consumer's own prefix-cache hit before it, in
    blocks); `reference` every prompt's reference block digests."""
    if received is None:
        return PdKvAudit(UNAVAILABLE, "the audit recorded no received blocks for this request")
    if not received:
        return PdKvAudit(UNAVAILABLE, "nothing received: no block to audit")
    if prompt not in reference:
        return PdKvAudit(UNAVAILABLE, f"the reference recorded no blocks of {prompt}")
    own, index = reference[prompt], reference_index(reference)
    slots, cells, unknown, unread = [], {}, 0, 0
    for i, digest in enumerate(received):
        slot = first_slot + i
        if digest is None:
            unread += 1
            slots.append((slot, None, None))
            continue
        if slot < len(own) and own[slot] == digest:
            slots.append((slot, prompt, slot))
            continue
        src = source_of(index, digest, prompt)
        if src is None:
            unknown += 1
            slots.append((slot, None, None))
            continue
        slots.append((slot, src.probe, src.block))
        # the verifier's cell classes: not bit-identical at its own position, no floor measured, bytes equal to src
        cells[(slot, 0, _PLANE)] = (classify_kv_cell(False, None, None, src, prompt), src)
    found = {c for c, _ in cells.values()}
    shape = describe(cells, prompt, first_slot + len(received)) if cells else None
    if CELL_FOREIGN in found:
        return PdKvAudit(FOREIGN, None, tuple(slots), shape)
    if CELL_MISPLACED in found:
        return PdKvAudit(MISPLACED, None, tuple(slots), shape)
    if unknown or unread:
        why = []
        if unknown:
            why.append(f"{unknown} received block(s) equal no reference block bit for bit (drift or garbage: only "
                       "the floor comparison tells them apart, and it is not run for P→D)")  # fmt: skip
        if unread:
            why.append(f"{unread} received block(s) the audit could not read")
        return PdKvAudit(UNAVAILABLE, "; ".join(why), tuple(slots))
    return PdKvAudit(EXACT, None, tuple(slots))
