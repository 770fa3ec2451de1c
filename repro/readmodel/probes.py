"""One probe of an arm as the read model holds it: its requests, cached and diff cells, divergences and KV verdict."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from repro.judge.verdict import FAIL, FINDING_WORDS, FINDINGS, KV_FINDINGS, UNAVAILABLE
from repro.judge.wording import blocks_text, shorten, span_text
from repro.readmodel.requests import Divergence, Request

KV_REASON_CHARS = 60  # an UNAVAILABLE reason in a table cell; the whole reason is in the probe's details
# What the finer KV findings mean, beside the legend's "CORRUPT beyond it" on a view that shows one (a report
# written before them never does, and its views read as they always did).
KV_FINER_LEGEND = (
    "Beyond the floor, a cell is MISPLACED when its bytes are this prompt's own KV from another block or plane "
    "(a block-mapping fault), FOREIGN when they are another prompt's KV, and CORRUPT when they equal nothing "
    "known (garbage, zeros): all three are findings"
)


def finding_of(data: Mapping[str, Any]) -> str | None:
    """A record's finding that no fixture's FAIL excuses (repro.judge.verdict.FINDINGS); None: none, or a report
    before them."""
    found = data.get("finding")
    return str(found) if found in FINDINGS else None


def finding_text(found: list[tuple[str, str]]) -> str:
    """'tenant-isolation failure on short-b · differs with no reported hit on p, q' from (finding, where) pairs,
    worst first; '' when there are none."""
    parts = []
    for finding in FINDINGS:
        where = list(dict.fromkeys(w for f, w in found if f == finding))
        if where:
            named = ", ".join(where[:3]) + (f" and {len(where) - 3} more" if len(where) > 3 else "")
            parts.append(f"{FINDING_WORDS[finding]} on {named}")
    return " · ".join(parts)


def kv_blame_text(blame: object, block_size: int | None = None) -> str:
    """What a KV finding (CORRUPT, FOREIGN, MISPLACED) blames: the report's own text, else one made from its
    blocks, planes and layers."""
    if not isinstance(blame, Mapping):
        return "nothing named"
    if isinstance(blame.get("text"), str) and blame["text"]:
        return blame["text"]
    planes = "+".join(str(p) for p in blame.get("planes") or []) or "?"
    layers = span_text(blame.get("layers") or []) or "?"
    return f"{blocks_text(blame.get('blocks') or [], block_size)}, {planes}, layers {layers}"


def probe_title(name: str, adapter: str | None) -> str:
    """'fixture-B · adapter B' for a probe under LoRA adapter B; its name alone under none."""
    return name if adapter is None else f"{name} · adapter {adapter}"


@dataclass(frozen=True)
class ProbeKV:
    """A probe's KV verdict (EXACT, NUMERIC, MISPLACED, FOREIGN, CORRUPT, UNAVAILABLE), its reasons and what a
    finding blames."""

    data: Mapping[str, Any] = field(repr=False)
    block_size: int | None

    @property
    def verdict(self) -> str:
        return str(self.data.get("verdict"))

    @property
    def reasons(self) -> tuple[str, ...]:
        return tuple(str(r) for r in self.data.get("reasons") or [])

    @property
    def is_finding(self) -> bool:
        """CORRUPT, FOREIGN or MISPLACED: the bytes a reuse read are not the baseline's (repro.judge.verdict)."""
        return self.verdict in KV_FINDINGS

    @property
    def blame_text(self) -> str:
        return kv_blame_text(self.data.get("blame"), self.block_size)

    @property
    def cell(self) -> str:
        """'EXACT', 'UNAVAILABLE (why…)', 'CORRUPT: blocks 0–15 (…), K+V, layers 0–3', 'MISPLACED: blocks …'."""
        if self.is_finding:
            return f"{self.verdict}: {self.blame_text}"
        reasons = self.data.get("reasons") or []
        if self.verdict == UNAVAILABLE and reasons:
            return f"{self.verdict} ({shorten(str(reasons[0]), KV_REASON_CHARS)})"
        return self.verdict


class KVCells:
    """A record's KV verdict for a table cell (a mixin over its ProbeKV, None when it was not audited)."""

    kv: ProbeKV | None

    @property
    def kv_verdict(self) -> str | None:
        return self.kv.verdict if self.kv is not None else None

    @property
    def kv_finding(self) -> bool:
        """The KV verdict is a finding (CORRUPT, FOREIGN, MISPLACED); False when not audited."""
        return self.kv is not None and self.kv.is_finding

    @property
    def kv_cell(self) -> str:
        """The KV verdict on one line ('EXACT', 'CORRUPT: blocks 0–15 (…), K+V, layers 0–3'); '—' when not audited."""
        return self.kv.cell if self.kv is not None else "—"


@dataclass(frozen=True)
class Probe(KVCells):
    """One probe of an arm: its verdict and the requests it sent (cold first, then the reuses)."""

    data: Mapping[str, Any] = field(repr=False)
    requests: tuple[Request, ...]
    kv: ProbeKV | None  # None: not audited (the baseline, a skipped probe, the audit off, a report before it)

    @classmethod
    def from_json(cls, data: Mapping[str, Any], block_size: int | None) -> Probe:
        requests = tuple(Request.from_json(r) for r in data.get("requests") or [])
        kv = data.get("kv")
        return cls(data, requests, ProbeKV(kv, block_size) if isinstance(kv, dict) else None)

    @property
    def name(self) -> str:
        return self.data["name"]

    @property
    def adapter(self) -> str | None:
        """The label of the LoRA adapter it ran under (repro.plan.adapters); None: the base model, or a report
        before adapters."""
        found = self.data.get("adapter")
        return None if found is None else str(found)

    @property
    def title(self) -> str:
        """Its name, and the adapter it ran under where it ran under one: 'fixture-B · adapter B'."""
        return probe_title(self.name, self.adapter)

    @property
    def verdict(self) -> str:
        return self.data["verdict"]

    @property
    def finding(self) -> str | None:
        """Its finding that no fixture's FAIL excuses: 'tenant-isolation', 'no-hit-differs'; None: none."""
        return finding_of(self.data)

    @property
    def prompt_tokens(self) -> int | None:
        return self.data.get("prompt_tokens")

    @property
    def tokens_text(self) -> str:
        return "" if self.prompt_tokens is None else str(self.prompt_tokens)

    @property
    def skipped(self) -> str:
        return str(self.data.get("skipped") or "")

    @property
    def reasons(self) -> tuple[str, ...]:
        return tuple(str(r) for r in self.data.get("reasons") or [])

    @property
    def reuses(self) -> tuple[Request, ...]:
        return self.requests[1:]

    @property
    def is_finding(self) -> bool:
        """A FAIL or a KV finding (CORRUPT, FOREIGN, MISPLACED)."""
        return self.verdict == FAIL or self.kv_finding

    @property
    def kv_shapes(self) -> tuple[str, ...]:
        """'reuse 1: slots 2–46 hold this prompt's blocks 92…48 in reverse': what each reuse's misplaced and
        foreign cells hold, said as one sentence (repro.judge.kv_shape); () when none says anything."""
        return tuple(
            f"{self.request_label(no, r)}: {r.kv_audit.shape}"
            for no, r in self.numbered_requests()
            if r.kv_audit is not None and r.kv_audit.shape
        )

    @property
    def cached_cell(self) -> str:
        """'0→1280×3': the cold request's cached count, then the reuses' (collapsed when equal)."""
        if not self.requests:
            return "—"

        def fmt(count: object) -> str:
            return "?" if count is None else str(count)  # absent is shown, never read as 0

        cold, reuses = fmt(self.requests[0].cached_tokens), [fmt(r.cached_tokens) for r in self.reuses]
        if not reuses:
            return cold
        if len(set(reuses)) == 1:
            return f"{cold}→{reuses[0]}" + (f"×{len(reuses)}" if len(reuses) > 1 else "")
        return f"{cold}→{','.join(reuses)}"

    @property
    def diff_cell(self) -> str:
        """'@4,15': the distinct first differing indices of the reuses, in order of appearance."""
        seen: list[int] = []
        for r in self.reuses:
            if r.first_diff is not None and r.first_diff not in seen:
                seen.append(r.first_diff)
        return "@" + ",".join(str(d) for d in seen) if seen else ""

    @cached_property
    def divergences(self) -> tuple[Divergence, ...]:
        """The reuses' divergences by first differing index, in order of appearance (as diff_cell)."""
        groups: dict[tuple, int] = {}
        for r in self.reuses:
            cls = r.divergence_class
            if cls is None:
                continue
            gap = r.top_gap
            key = (r.first_diff, cls, gap if isinstance(gap, (int, float)) else None)
            groups[key] = groups.get(key, 0) + 1
        return tuple(Divergence(i, cls, gap, n) for (i, cls, gap), n in groups.items())

    @property
    def classed_divergences(self) -> tuple[Divergence, ...]:
        """The divergences a view shows with their class: a FAIL probe's (its verdict rests on them); none otherwise."""
        return self.divergences if self.verdict == FAIL else ()

    @property
    def diff_class_cell(self) -> str:
        """'@13 (near-tie, gap 0.045 nats)' for a FAIL probe; any other keeps diff_cell's '@4,15' (or '')."""
        groups = self.classed_divergences
        return ", ".join(g.text for g in groups) if groups else self.diff_cell

    @property
    def tokens_verdict(self) -> str:
        """'FAIL @13 (near-tie, gap 0.045 nats)', 'PASS'."""
        return f"{self.verdict} {self.diff_class_cell}".rstrip()

    def replay_lines(self, whole: bool = False) -> tuple[str, ...]:
        """'reuse 1: replays fixture's answer from @0, 7 tokens', a line per reuse that replays something;
        reuses with the same text share a line ('reuses 1, 2, 3: …')."""
        by_text: dict[str, list[int]] = {}
        for no, r in self.numbered_requests():
            text = r.replay_text(whole) if r.is_reuse else ""
            if text:
                by_text.setdefault(text, []).append(no)
        return tuple(
            f"reuse{'s' if len(nos) > 1 else ''} {', '.join(map(str, nos))}: {text}" for text, nos in by_text.items()
        )

    def prompt_logprob_lines(self) -> tuple[str, ...]:
        """'reuse 1: prompt logprobs' top-1 IDs differ @0 at 287 of 299 positions; ...', a line per request whose
        prompt logprobs say something (Request.prompt_logprobs_text); () for a probe that asked for none."""
        return tuple(
            f"{self.request_label(no, r)}: {r.prompt_logprobs_text}"
            for no, r in self.numbered_requests()
            if r.prompt_logprobs_text
        )

    def numbered_requests(self) -> list[tuple[int, Request]]:
        """Each request with the number of reuses up to it ('reuse 1' is the first reuse)."""
        out, no = [], 0
        for r in self.requests:
            no += r.is_reuse
            out.append((no, r))
        return out

    def request_label(self, no: int, request: Request) -> str:
        return f"reuse {no}" if request.is_reuse else str(request.data.get("role", "?"))
