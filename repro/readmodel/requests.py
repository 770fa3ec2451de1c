"""One request of a probe as the read model holds it: its tokens, divergence, replays and KV audit."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from repro.judge.compare import NEAR_TIE_NATS
from repro.judge.kv_grid import dense_planes
from repro.judge.kv_verdict import CELL_CORRUPT, FINDING_OF
from repro.judge.kvaudit import MATCHES_KEPT
from repro.judge.prompt_logprobs import EXACT_VALUES, TURNED_OFF
from repro.judge.replays import BASELINE as REPLAY_BASELINE
from repro.judge.replays import MIN_REPLAY_TOKENS
from repro.judge.verdict import UNCLASSED, classify_divergence
from repro.judge.wording import class_text, spans

_AUDIT_SOURCE = re.compile(r"^probe (.+) block \d+$")


def _mapping(value: object) -> Mapping[str, Any] | None:
    return value if isinstance(value, dict) else None


def margin_class(margin: object) -> str:
    """The class a recorded margin gives its divergence (repro.judge.verdict.classify_divergence)."""
    if not isinstance(margin, Mapping):
        return UNCLASSED
    return classify_divergence(margin.get("baseline_top_gap"), margin.get("near_tie"))


def match_text(match: Mapping[str, Any], with_rel: bool = True) -> str:
    """What an audit match says of a cell's bytes: the block they equal ("block 92"), or, where none is equal and the
    audit kept the nearest by relative error (a `rel`), "nearest block 90 (rel 0.921)": nearest is not equal."""
    source = str(match.get("source"))
    rel = match.get("rel")
    if isinstance(rel, (int, float)) and not isinstance(rel, bool):
        return f"nearest {source}" + (f" (rel {rel:.3g})" if with_rel else "")
    return source


@dataclass(frozen=True)
class Divergence:
    """The reuses of one probe that first differed at one index (the baseline's gap there is one number)."""

    index: int
    cls: str
    gap: float | None
    count: int

    @property
    def text(self) -> str:
        return f"@{self.index} ({class_text(self.cls, self.gap, self.count)})"


@dataclass(frozen=True)
class Replay:
    """A run of a divergent reuse's tokens that is another probe's answer, or an earlier request's (repro.judge.replays)."""

    request: object  # repro.judge.replays.BASELINE, "cold" or "reuse N"
    probe: object
    start: object
    tokens: object
    answers_as: object = None  # the source is this prompt under another LoRA adapter: "adapter A"; absent before

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Replay:
        found = (data.get("request"), data.get("probe"), data.get("from"), data.get("tokens"))
        return cls(*found, data.get("answers_as"))

    @property
    def of_another_probe(self) -> bool:
        return self.request == REPLAY_BASELINE

    @property
    def text(self) -> str:
        """'replays fixture's answer from @0, 7 tokens'; an earlier request of the same probe 'repeats its
        reuse 1's answer from @9, 7 tokens' (or 'its cold request's answer')."""
        span = f"from @{self.start}, {self.tokens} tokens"
        if self.answers_as:  # key identity: another adapter's answer to this very prompt
            return f"answers as {self.answers_as}: replays {self.probe}'s answer {span}"
        if self.of_another_probe:
            return f"replays {self.probe}'s answer {span}"
        return f"repeats its {'cold request' if self.request == 'cold' else self.request}'s answer {span}"

    @property
    def indices(self) -> range:
        ok = isinstance(self.start, int) and isinstance(self.tokens, int)
        return range(self.start, self.start + self.tokens) if ok else range(0)


@dataclass(frozen=True)
class RequestAudit:
    """The KV audit of one request: the cold request's floor, or a reuse's cells by block x layer x K/V plane."""

    data: Mapping[str, Any] = field(repr=False)

    @property
    def status(self) -> object:
        return self.data.get("status")

    @property
    def audited(self) -> bool:
        return self.status == "audited"

    @property
    def first_block(self) -> int:
        return int(self.data.get("first_block") or 0)

    @property
    def matches(self) -> tuple[Mapping[str, Any], ...]:
        return tuple(self.data.get("matches") or [])

    @cached_property
    def planes(self) -> Mapping[str, Any]:
        """The cells, per plane: class, max_abs and rel, a row per layer and an entry per block, whichever form
        the report stored them in (dense rows, schema_version 2; runs, 3 on: repro.judge.kv_grid)."""
        return dense_planes(self.data.get("planes"))

    @property
    def counts(self) -> Mapping[str, Any]:
        return self.data.get("counts") or {}

    @property
    def shape(self) -> str:
        """What the misplaced and foreign cells hold, as one sentence (repro.judge.kv_shape); '' when nothing
        (a report written before those classes, or no such cell)."""
        found = self.data.get("shape")
        return found if isinstance(found, str) else ""

    @cached_property
    def reported_blocks(self) -> tuple[int, ...]:
        """The prompt blocks the connector reported to vLLM as not loaded (absolute block numbers): read and classed,
        never blamed (repro.judge.kvaudit.LOAD_ERRORS_NOTE)."""
        found = (self.data.get("load_errors") or {}).get("blocks") or ()
        return tuple(sorted(self.first_block + int(b) for b in found))

    def _blocks_with(self, classes: frozenset[str] | set[str] | tuple[str, ...]) -> tuple[int, ...]:
        found = set()
        for plane in self.planes.values() if isinstance(self.planes, Mapping) else ():
            for row in (plane or {}).get("class") or []:
                found.update(self.first_block + i for i, c in enumerate(str(row)) if c in classes)
        return tuple(sorted(found - set(self.reported_blocks)))

    def get(self, key: str) -> Any:
        """A recorded figure as the report stores it (num_blocks, layers, max_rel, origin, ...)."""
        return self.data.get(key)

    @cached_property
    def source_probes(self) -> tuple[str, ...]:
        """The other probes whose KV the audit found in what this reuse read (what its wrong bytes equal,
        'probe fixture block 48'), from layer 1 on: layer 0's K and V depend only on a token and its position,
        so prompts with the same token at the same place share them; later layers depend on everything before."""
        sources = (str(m.get("source")) for m in self.matches if isinstance(m, Mapping) and _deep(m.get("layer")))
        return tuple(sorted({m.group(1) for m in map(_AUDIT_SOURCE.match, sources) if m}))

    @property
    def sources_complete(self) -> bool:
        """Audited, and every cell whose bytes the audit matched is in the report (it keeps the first
        repro.judge.kvaudit.MATCHES_KEPT, layer 0 first: a long prompt's deeper layers may be cut)."""
        return self.audited and len(self.matches) < MATCHES_KEPT

    @cached_property
    def corrupt_blocks(self) -> tuple[int, ...]:
        """The prompt blocks with at least one corrupt cell (absolute block numbers)."""
        return self._blocks_with((CELL_CORRUPT,))

    @cached_property
    def blamed_blocks(self) -> tuple[int, ...]:
        """The prompt blocks the audit blames: with at least one finding cell, corrupt, foreign or misplaced (the
        bytes are not the baseline's, whatever they are), as the probe's KV verdict blames them."""
        return self._blocks_with(tuple(FINDING_OF))

    @cached_property
    def blamed_chunks(self) -> tuple[BlamedChunk, ...]:
        """The finding cells (corrupt, foreign, misplaced) grouped by runs of adjacent blocks; none unless the
        reuse was audited."""
        if not self.audited:
            return ()
        first = self.first_block
        matches = {
            (m.get("layer"), m.get("plane"), m.get("block")): match_text(m, with_rel=False) for m in self.matches
        }
        cells = []  # (block, layer, plane, rel, class)
        for name, plane in sorted(self.planes.items()):
            for layer, row in enumerate(plane.get("class") or []):
                rels = (plane.get("rel") or [])[layer] if layer < len(plane.get("rel") or []) else []
                cells += [
                    (first + i, layer, name, rels[i] if i < len(rels) else None, c)
                    for i, c in enumerate(str(row))
                    if c in FINDING_OF and first + i not in self.reported_blocks
                ]
        chunks = []
        for a, b in spans([c[0] for c in cells]):
            inside = [c for c in cells if a <= c[0] <= b]
            rels = [c[3] for c in inside]
            sources = [matches[(layer, p, blk)] for blk, layer, p, _, _ in inside if (layer, p, blk) in matches]
            chunks.append(
                BlamedChunk(
                    blocks=tuple(range(a, b + 1)),
                    layers=tuple(sorted({c[1] for c in inside})),
                    planes=tuple(sorted({c[2] for c in inside})),
                    max_rel=None if any(r is None for r in rels) else max(rels),
                    cells=len(inside),
                    sources=tuple(str(s) for s in sources),
                    classes=tuple((c, n) for c in FINDING_OF if (n := sum(1 for x in inside if x[4] == c))),
                )
            )
        return tuple(chunks)


@dataclass(frozen=True)
class BlamedChunk:
    """A run of adjacent blocks with finding cells (corrupt, foreign, misplaced): the layers and planes with one,
    how many, the largest relative error (None: one is not finite), what the cells' bytes equal where the audit
    found it, and how many cells of each class (worst first)."""

    blocks: tuple[int, ...]
    layers: tuple[int, ...]
    planes: tuple[str, ...]
    max_rel: float | None
    cells: int
    sources: tuple[str, ...]  # one per finding cell whose bytes the audit matched
    classes: tuple[tuple[str, int], ...] = ()  # (cell class, cells): ("c", 3), ("m", 12); worst first

    @property
    def only_corrupt(self) -> bool:
        """Every cell is corrupt (as in every report written before the foreign and misplaced classes)."""
        return all(cls == CELL_CORRUPT for cls, _ in self.classes)


def _deep(layer: object) -> bool:
    return isinstance(layer, int) and not isinstance(layer, bool) and layer > 0


@dataclass(frozen=True)
class Request:
    """One request of a probe: cold or a reuse, what it cached, generated and how it differed from the baseline."""

    data: Mapping[str, Any] = field(repr=False)
    kv_audit: RequestAudit | None
    replays: tuple[Replay, ...]

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Request:
        audit = _mapping(data.get("kv_audit"))
        found = data.get("replays")
        replays = tuple(Replay.from_json(r) for r in found if isinstance(r, dict)) if isinstance(found, list) else ()
        return cls(data, RequestAudit(audit) if audit is not None else None, replays)

    @property
    def role(self) -> object:
        return self.data.get("role")

    @property
    def is_reuse(self) -> bool:
        return self.role == "reuse"

    @property
    def cached_tokens(self) -> object:
        return self.data.get("cached_tokens")

    @property
    def first_diff(self) -> int | None:
        return self.data.get("first_diff")

    @property
    def prompt_logprobs_text(self) -> str:
        """What its prompt logprobs say (repro.judge.prompt_logprobs): 'reuse turned off by prompt_logprobs' where a
        reuse that asked for them reported 0 cached tokens, and how they differ from the baseline's ('top-1 IDs differ
        @0 at 287 of 299 positions; values differ @0-287 (288 no logprob; ...)'); '' where it asked for
        none, or they are the baseline's exactly and reuse ran."""
        plp = _mapping(self.data.get("prompt_logprobs"))
        if plp is None:
            return ""
        parts = [f"{TURNED_OFF} (prompt_logprobs={plp.get('k')})"] if self.is_reuse and self.cached_tokens == 0 else []
        vs = _mapping(plp.get("vs_baseline"))
        if vs is not None and vs.get("class") != EXACT_VALUES:
            if vs.get("top1_differ"):
                parts.append(f"prompt logprobs' top-1 IDs differ @{vs.get('top1_first_diff')} at {vs.get('top1_differ')} "
                             f"of {vs.get('baseline_positions')} positions")  # fmt: skip
            if vs.get("value_first_diff") is not None:
                parts.append(f"values differ @{vs.get('value_first_diff')}-{vs.get('value_last_diff')} "
                             f"({vs.get('invalid')} no logprob; max |diff| {vs.get('max_abs_diff')} where both are)")  # fmt: skip
        return "; ".join(parts)

    @property
    def token_ids(self) -> list[int] | None:
        return self.data.get("token_ids")

    @property
    def text(self) -> object:
        return self.data.get("text")

    @property
    def finish_reason(self) -> object:
        return self.data.get("finish_reason")

    @property
    def margin(self) -> Mapping[str, Any] | None:
        return self.data.get("margin")

    @property
    def top_gap(self) -> object:
        return self.margin.get("baseline_top_gap") if isinstance(self.margin, Mapping) else None

    @property
    def divergence_class(self) -> str | None:
        """The class of this request's divergence from the baseline; None when it did not diverge."""
        return None if self.first_diff is None else margin_class(self.margin)

    @property
    def planted_blocks(self) -> tuple[int, ...]:
        """The prompt blocks the planted-fault connector corrupted on purpose for this request (none for others)."""
        fault = ((self.data.get("kv_transfer_params") or {}).get("planted_fault")) or {}
        blocks = fault.get("faulted_blocks") if isinstance(fault, dict) else None
        if not isinstance(blocks, list):
            return ()
        return tuple(sorted({b for b in blocks if isinstance(b, int) and not isinstance(b, bool)}))

    @property
    def audit_source_probes(self) -> tuple[str, ...]:
        """The other probes whose KV the audit found in this reuse from layer 1 on; () when none or not audited."""
        return self.kv_audit.source_probes if self.kv_audit is not None else ()

    @property
    def replay_texts(self) -> tuple[str, ...]:
        """Each replay as text, with what the KV audit found where it read the reuse: '… (KV audit: fixture's
        blocks)', or '(KV audit: not fixture's blocks)' when it found others or none (the tokens match by
        chance: a small model's answers share phrases). Nothing added without the audit, nor a 'not' when the
        report kept only some of what it matched."""
        sources = self.audit_source_probes
        complete = self.kv_audit is not None and self.kv_audit.sources_complete
        out = []
        for r in self.replays:
            text = r.text
            if r.of_another_probe and r.probe in sources:
                text += f" (KV audit: {r.probe}'s blocks)"
            elif r.of_another_probe and complete:
                text += f" (KV audit: not {r.probe}'s blocks)"
            out.append(text)
        return tuple(out)

    def replay_text(self, whole: bool = False) -> str:
        """'replays fixture's answer from @0, 7 tokens (+1 more)'; every replay when whole; '' for none."""
        found = self.replay_texts
        if whole or len(found) < 2:
            return "; ".join(found)
        return f"{found[0]} (+{len(found) - 1} more)"

    @property
    def replay_indices(self) -> set[int]:
        """The token indices its replays cover (to mark them in a token grid)."""
        return {i for r in self.replays for i in r.indices}


DIVERGENCE_LEGEND = (
    f"each divergence of a FAIL is classed from the baseline's top-1/top-2 logprob gap at that index: near-tie "
    f"under {NEAR_TIE_NATS:g} nats (the baseline itself nearly chose the other token), decisive otherwise"
)
REPLAY_LEGEND = (
    f"a replay is a run of at least {MIN_REPLAY_TOKENS} generated tokens that equal another probe's baseline answer "
    "(or an earlier request of the same probe) at the same indices where they differ from this probe's own baseline"
)
