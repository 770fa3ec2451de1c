"""How report facts are shown as short text, once for every view: the text summary, the site and
the issue Markdown. Pure functions over a report dict (as written, or as loaded)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from repro.compare import NEAR_TIE_NATS
from repro.replays import BASELINE as REPLAY_BASELINE
from repro.replays import MIN_REPLAY_TOKENS
from repro.verdict import (
    CELL_CORRUPT,
    CORRUPT,
    DECISIVE,
    EXACT,
    FAIL,
    NEAR_TIE,
    NUMERIC,
    UNAVAILABLE,
    UNCLASSED,
    DivergenceTally,
    classify_divergence,
    tally_divergences,
)

_HEX = re.compile(r"^[0-9a-f]{7,40}$")
NO_SUITE = "n/a (no acceptance suite)"


def commit_label(provenance: dict) -> str:
    """'1a2b3c4d5e6f', '…+dirty' or '… (dirty: unknown)'; a non-hash (e.g. 'unavailable: …') whole."""
    kit = provenance.get("kit") or {}
    commit = str(kit.get("commit") or "?")  # an empty or null commit says nothing: shown as unknown
    short = commit[:12] if _HEX.match(commit) else commit
    return short + {True: "+dirty", False: "", None: " (dirty: unknown)"}.get(kit.get("dirty"), "")


def is_commit_hash(text: str) -> bool:
    return bool(_HEX.match(text))


def acceptance_label(report: dict, short: bool = False) -> str:
    """'true', 'false', or 'n/a (no acceptance suite)' ('n/a' when short)."""
    matched = report["acceptance"].get("matched")
    if matched is None:
        return "n/a" if short else NO_SUITE
    return str(matched).lower()


def cached_cell(probe: dict) -> str:
    """'0→1280×3': the cold request's cached count, then the reuses' (collapsed when equal)."""
    reqs = probe.get("requests") or []
    if not reqs:
        return "—"

    def fmt(count: int | None) -> str:
        return "?" if count is None else str(count)  # absent is shown, never read as 0

    cold, reuses = fmt(reqs[0].get("cached_tokens")), [fmt(r.get("cached_tokens")) for r in reqs[1:]]
    if not reuses:
        return cold
    if len(set(reuses)) == 1:
        return f"{cold}→{reuses[0]}" + (f"×{len(reuses)}" if len(reuses) > 1 else "")
    return f"{cold}→{','.join(reuses)}"


def diff_cell(probe: dict) -> str:
    """'@4,15': the distinct first differing indices of the reuses, in order of appearance."""
    seen: list[int] = []
    for r in (probe.get("requests") or [])[1:]:
        d = r.get("first_diff")
        if d is not None and d not in seen:
            seen.append(d)
    return "@" + ",".join(str(d) for d in seen) if seen else ""


def arm_title(arm: dict) -> str:
    """'baseline', 'native prefix caching', the connector's name, or 'ARM (CONNECTOR)'."""
    if arm["mode"] == "baseline":
        return "baseline"
    if arm["mode"] == "native":
        if arm.get("matched_to"):
            return f"native prefix caching, matched to {arm['matched_to']}"
        return "native prefix caching"
    connector = (arm.get("connector") or {}).get("name")
    return arm["name"] if arm["name"] == connector else f"{arm['name']} ({connector})"


def baseline_arm(report: dict) -> dict | None:
    return next((a for a in report["arms"] if a["mode"] == "baseline"), None)


def baseline_probes(report: dict) -> dict[str, dict]:
    """The baseline's probes by name (empty when there is no baseline)."""
    return {p["name"]: p for p in (baseline_arm(report) or {}).get("probes") or []}


def baseline_token_ids(report: dict, probe_name: str) -> list[int] | None:
    """The baseline's generated token IDs for a probe, or None when it has none."""
    reqs = (baseline_probes(report).get(probe_name) or {}).get("requests") or []
    return reqs[0].get("token_ids") if reqs else None


def day(report: dict) -> str:
    """The report's start date, YYYY-MM-DD."""
    return str(report["provenance"].get("started_utc", "?"))[:10]


def headline(report: dict) -> str:
    """'NVIDIA L4 · 1a2b3c4d5e6f · 2026-11-29': hardware, kit commit, date."""
    return f"{report.get('hardware_label', '?')} · {commit_label(report['provenance'])} · {day(report)}"


# --- Divergence classes (repro.verdict.classify_divergence), from each request's margin field. ---
# Every report ever written carries margin.baseline_top_gap, so schema 1 and 2 are classed alike.

GAP_DIGITS = 3  # decimals of a gap in nats; more only where 3 would show a number of the other class
DIVERGENCE_LEGEND = (
    f"each divergence of a FAIL is classed from the baseline's top-1/top-2 logprob gap at that index: near-tie "
    f"under {NEAR_TIE_NATS:g} nats (the baseline itself nearly chose the other token), decisive otherwise"
)


def divergence_class(request: dict) -> str | None:
    """The class of a request's divergence from the baseline; None when it did not diverge."""
    if request.get("first_diff") is None:
        return None
    return margin_class(request.get("margin"))


def margin_class(margin: object) -> str:
    """The class a recorded margin gives its divergence (repro.verdict.classify_divergence)."""
    if not isinstance(margin, dict):
        return UNCLASSED
    return classify_divergence(margin.get("baseline_top_gap"), margin.get("near_tie"))


def _top_gap(request: dict) -> object:
    margin = request.get("margin")
    return margin.get("baseline_top_gap") if isinstance(margin, dict) else None


def gap_text(gap: object, cls: str | None = None) -> str:
    """'gap 0.045 nats'; 'no top-2 gap recorded'. The number printed beside a class never reads as the
    other class: 0.0996 is shown as 0.0996, not 0.100, and a near-tie whose gap the report rounded
    onto the threshold as 'gap <0.1 nats'. cls: the divergence's class (default: the gap's own)."""
    cls = cls or classify_divergence(gap)
    if cls == UNCLASSED or classify_divergence(gap) == UNCLASSED:
        return "no top-2 gap recorded"
    for digits in range(GAP_DIGITS, 7):  # the report keeps 6 decimals
        text = f"{gap:.{digits}f}"
        if classify_divergence(float(text)) == cls:
            return f"gap {text} nats"
    return f"gap <{NEAR_TIE_NATS:g} nats"


def class_text(cls: str, gap: object, count: int = 1) -> str:
    """'near-tie, gap 0.045 nats'; 'decisive ×3, gap 0.682 nats' (3 reuses diverged there)."""
    return f"{cls}{f' ×{count}' if count > 1 else ''}, {gap_text(gap, cls)}"


@dataclass(frozen=True)
class DivergenceGroup:
    """The reuses of one probe that first differed at one index (the baseline's gap there is one number)."""

    index: int
    cls: str
    gap: float | None
    count: int

    @property
    def text(self) -> str:
        return f"@{self.index} ({class_text(self.cls, self.gap, self.count)})"


def probe_divergences(probe: dict) -> list[DivergenceGroup]:
    """A probe's reuse divergences by first differing index, in order of appearance (as diff_cell)."""
    groups: dict[tuple, list] = {}
    for r in (probe.get("requests") or [])[1:]:
        cls = divergence_class(r)
        if cls is None:
            continue
        gap = _top_gap(r)
        key = (r["first_diff"], cls, gap if isinstance(gap, (int, float)) else None)
        groups.setdefault(key, []).append(r)
    return [DivergenceGroup(i, cls, gap, len(rs)) for (i, cls, gap), rs in groups.items()]


def classed_divergences(probe: dict) -> list[DivergenceGroup]:
    """The groups a view shows with their class: a FAIL probe's (its verdict rests on them); none otherwise."""
    return probe_divergences(probe) if probe.get("verdict") == FAIL else []


def diff_class_cell(probe: dict) -> str:
    """'@13 (near-tie, gap 0.045 nats)', '@4 (decisive, gap 2.100 nats), @15 (near-tie, gap 0.031 nats)' for a
    FAIL probe; any other probe keeps diff_cell's '@4,15' (or '')."""
    groups = classed_divergences(probe)
    return ", ".join(g.text for g in groups) if groups else diff_cell(probe)


def arm_divergences(arm: dict) -> DivergenceTally:
    """The arm's divergences counted by class: every reuse that differed in a FAIL probe, one each."""
    return tally_divergences(
        g.cls for p in arm.get("probes") or [] for g in classed_divergences(p) for _ in range(g.count)
    )


def arm_class_text(arm: dict) -> str:
    """'near-ties only: 2', 'decisive: 6', 'decisive: 1, near-tie: 1' for a FAIL arm; '' for any other."""
    if arm.get("verdict") != FAIL:
        return ""
    tally = arm_divergences(arm)
    if not tally.total:
        return ""
    if tally.near_ties_only:
        return f"near-ties only: {tally.near_tie}"
    counts = ((DECISIVE, tally.decisive), (NEAR_TIE, tally.near_tie), (UNCLASSED, tally.unclassed))
    return ", ".join(f"{cls}: {n}" for cls, n in counts if n)


def arm_verdict_text(arm: dict) -> str:
    """'FAIL (near-ties only: 2)', 'FAIL (decisive: 6)'; other verdicts as they are. A verdict measured
    under conditions that qualify it says so: 'FAIL (decisive: 6) · contention-dependent: clean when re-run
    alone' (finding_class_text); a report without trials or a confirmation keeps the bare verdict."""
    note = arm_class_text(arm)
    text = f"{arm['verdict']} ({note})" if note else str(arm["verdict"])
    qualifier = finding_class_text(arm)
    return f"{text} · {qualifier}" if qualifier else text


# --- Replayed answers (repro.replays): a divergent reuse's tokens that are another probe's answer, or an
# earlier request's. A report made before they were recorded has none: these return "" or nothing.


REPLAY_LEGEND = (
    f"a replay is a run of at least {MIN_REPLAY_TOKENS} generated tokens that equal another probe's baseline answer "
    "(or an earlier request of the same probe) at the same indices where they differ from this probe's own baseline"
)


_AUDIT_SOURCE = re.compile(r"^probe (.+) block \d+$")


def audit_source_probes(request: dict) -> list[str]:
    """The other probes whose KV the KV audit found in what this reuse read (what its wrong bytes equal,
    'probe fixture block 48'), from layer 1 on: layer 0's K and V depend only on a token and its position,
    so prompts with the same token at the same place share them; later layers depend on everything before.
    [] when it found none or the reuse was not audited."""
    audit = request.get("kv_audit")
    matches = audit.get("matches") if isinstance(audit, dict) else None
    sources = (str(x.get("source")) for x in matches or [] if isinstance(x, dict) and _deep(x.get("layer")))
    return sorted({m.group(1) for m in map(_AUDIT_SOURCE.match, sources) if m})


def _deep(layer: object) -> bool:
    return isinstance(layer, int) and not isinstance(layer, bool) and layer > 0


def replay_text(replay: dict) -> str:
    """'replays fixture's answer from @0, 7 tokens'; an earlier request of the same probe 'repeats its
    reuse 1's answer from @9, 7 tokens' (or 'its cold request's answer')."""
    request = replay.get("request")
    span = f"from @{replay.get('from')}, {replay.get('tokens')} tokens"
    if request == REPLAY_BASELINE:
        return f"replays {replay.get('probe')}'s answer {span}"
    return f"repeats its {'cold request' if request == 'cold' else request}'s answer {span}"


def request_replays(request: dict) -> list[dict]:
    """A reuse's replays as the report stores them, other probes' answers first; [] when it has none."""
    found = request.get("replays")
    return [r for r in found if isinstance(r, dict)] if isinstance(found, list) else []


def _sources_complete(request: dict) -> bool:
    """The reuse was audited and every cell whose bytes the audit matched is in the report (it keeps the
    first repro.kvaudit.MATCHES_KEPT, layer 0 first: a long prompt's deeper layers may be cut)."""
    from repro.kvaudit import MATCHES_KEPT  # repro.kvaudit imports this module: read at call time

    audit = request.get("kv_audit")
    if not isinstance(audit, dict) or audit.get("status") != "audited":
        return False
    return len(audit.get("matches") or []) < MATCHES_KEPT


def replay_texts(request: dict) -> list[str]:
    """Each replay of a reuse as text, with what the KV audit found where it read the reuse: 'replays
    fixture's answer from @0, 7 tokens (KV audit: fixture's blocks)', or '(KV audit: not fixture's blocks)'
    when it found others or none (the tokens match by chance: a small model's answers share phrases).
    Nothing added without the audit, nor a 'not' when the report kept only some of what it matched."""
    sources, complete = audit_source_probes(request), _sources_complete(request)
    out = []
    for r in request_replays(request):
        text = replay_text(r)
        if r.get("request") == REPLAY_BASELINE and r.get("probe") in sources:
            text += f" (KV audit: {r.get('probe')}'s blocks)"
        elif r.get("request") == REPLAY_BASELINE and complete:
            text += f" (KV audit: not {r.get('probe')}'s blocks)"
        out.append(text)
    return out


def request_replay_text(request: dict, whole: bool = False) -> str:
    """'replays fixture's answer from @0, 7 tokens (+1 more)'; every replay when whole; '' for none."""
    found = replay_texts(request)
    if whole or len(found) < 2:
        return "; ".join(found)
    return f"{found[0]} (+{len(found) - 1} more)"


def probe_replay_lines(probe: dict, whole: bool = False) -> list[str]:
    """'reuse 1: replays fixture's answer from @0, 7 tokens', a line per reuse that replays something;
    reuses with the same text share a line ('reuses 1, 2, 3: …')."""
    by_text: dict[str, list[int]] = {}
    reuse_no = 0
    for r in probe.get("requests") or []:
        reuse_no += r.get("role") == "reuse"
        text = request_replay_text(r, whole) if r.get("role") == "reuse" else ""
        if text:
            by_text.setdefault(text, []).append(reuse_no)
    return [f"reuse{'s' if len(nos) > 1 else ''} {', '.join(map(str, nos))}: {text}" for text, nos in by_text.items()]


def replay_indices(request: dict) -> set[int]:
    """The token indices of a reuse that its replays cover (to mark them in a token grid)."""
    covered: set[int] = set()
    for r in request_replays(request):
        start, n = r.get("from"), r.get("tokens")
        if isinstance(start, int) and isinstance(n, int):
            covered.update(range(start, start + n))
    return covered


# --- The KV audit (report schema 2). A report of schema 1 has none of these fields. ---

KV_REASON_CHARS = 60  # an UNAVAILABLE reason in a table cell; the whole reason is in the probe's details
# The order a tally lists KV verdicts in: findings first.
KV_TALLY_ORDER = (CORRUPT, UNAVAILABLE, NUMERIC, EXACT)


def kv_audit_state(report: dict) -> bool | None:
    """None: the report predates the KV audit (schema 1); otherwise whether the run audited KV."""
    config = report.get("config") or {}
    return bool(config["kv_audit"]) if "kv_audit" in config else None


def number(value: object) -> str:
    """An error measure in three significant digits ('3.1e-07', '0.25'); '—' when not a number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "—"
    return f"{value:.3g}"


def spans(indices: list[int] | tuple[int, ...]) -> list[tuple[int, int]]:
    """Sorted distinct indices as inclusive runs: [0, 1, 2, 5] -> [(0, 2), (5, 5)]."""
    runs: list[tuple[int, int]] = []
    for i in sorted(set(indices)):
        if runs and i == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], i)
        else:
            runs.append((i, i))
    return runs


def span_text(indices: list[int] | tuple[int, ...]) -> str:
    """'0–15, 20': runs of indices, en dash between the ends."""
    return ", ".join(str(a) if a == b else f"{a}–{b}" for a, b in spans(indices))


def blocks_text(blocks: list[int] | tuple[int, ...], block_size: int | None) -> str:
    """'blocks 0–15 (tokens 0–255)'; 'none' for no block; the tokens left out when the block size is unknown."""
    if not blocks:
        return "none"
    text = f"block{'s' if len(set(blocks)) > 1 else ''} {span_text(blocks)}"
    if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size < 1:
        return text
    tokens = ", ".join(f"{a * block_size}–{(b + 1) * block_size - 1}" for a, b in spans(blocks))
    return f"{text} (tokens {tokens})"


def kv_blame_text(blame: object, block_size: int | None = None) -> str:
    """What a CORRUPT verdict blames: the report's own text, else one made from its blocks, planes and layers."""
    if not isinstance(blame, dict):
        return "nothing named"
    if isinstance(blame.get("text"), str) and blame["text"]:
        return blame["text"]
    planes = "+".join(str(p) for p in blame.get("planes") or []) or "?"
    layers = span_text(blame.get("layers") or []) or "?"
    return f"{blocks_text(blame.get('blocks') or [], block_size)}, {planes}, layers {layers}"


def _shorten(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def kv_cell(probe: dict, block_size: int | None = None) -> str:
    """A probe's KV verdict on one line: 'EXACT', 'UNAVAILABLE (why…)', 'CORRUPT: blocks 0–15 (…), K+V, layers 0–3';
    '—' when the probe was not audited (the baseline, a skipped probe, the audit off)."""
    kv = probe.get("kv")
    if not isinstance(kv, dict):
        return "—"
    verdict = str(kv.get("verdict"))
    if verdict == CORRUPT:
        return f"{verdict}: {kv_blame_text(kv.get('blame'), block_size)}"
    reasons = kv.get("reasons") or []
    if verdict == UNAVAILABLE and reasons:
        return f"{verdict} ({_shorten(str(reasons[0]), KV_REASON_CHARS)})"
    return verdict


def kv_verdict(probe: dict) -> str | None:
    kv = probe.get("kv")
    return str(kv.get("verdict")) if isinstance(kv, dict) else None


def kv_findings(report: dict) -> list[tuple[dict, dict]]:
    """(arm, probe) of every probe whose KV verdict is CORRUPT, in report order."""
    return [
        (arm, probe)
        for arm in report["arms"]
        if arm["mode"] != "baseline"
        for probe in arm.get("probes") or []
        if kv_verdict(probe) == CORRUPT
    ]


def floor_text(floor: object) -> str:
    """How far the arm's own cold prefill KV differed from the baseline's: the bound for the numeric class."""
    if not isinstance(floor, dict) or not floor.get("cells"):
        return "floor not measured (no cold prefill was compared)"
    over = f" over {floor['cells']} cells"
    if floor.get("identical"):
        return f"floor 0: the cold prefill's KV is bit-identical to the baseline's{over}"
    if floor.get("rel") is None:
        return f"floor not measured: the cold prefill's relative error is not a finite number{over}"
    return f"floor rel {number(floor.get('rel'))} (max abs {number(floor.get('max_abs'))}){over}"


def floor_rel_text(floor: object) -> str:
    """'floor rel 3.1e-07', 'floor rel 0 (bit-identical)' or 'floor not measured': for a caption."""
    if not isinstance(floor, dict) or not floor.get("cells"):
        return "floor not measured"
    if floor.get("identical"):
        return "floor rel 0 (bit-identical)"
    rel = floor.get("rel")
    return "floor not measured" if rel is None else f"floor rel {number(rel)}"


def arm_kv_text(arm: dict) -> str:
    """'KV audit: ok · floor rel …', 'KV audit: reference (…)', 'KV audit: unavailable (why)', or 'KV audit: not run'."""
    audit = arm.get("kv_audit")
    if not isinstance(audit, dict):
        return "KV audit: not run"
    status = str(audit.get("status"))
    reason = f" ({audit['reason']})" if audit.get("reason") else ""
    if status == "reference":
        shape = audit.get("kv_shape")
        layout = ", ".join(
            part
            for part in (
                f"{audit.get('layers')} layers" if audit.get("layers") is not None else "",
                f"layout {audit['layout']}" if audit.get("layout") else "",
                f"dtype {audit['dtype']}" if audit.get("dtype") else "",
                f"shape {'×'.join(map(str, shape))}" if isinstance(shape, list) and shape else "",
            )
            if part
        )
        return f"KV audit: reference KV recorded{reason}" + (f" ({layout})" if layout else "")
    if status == "ok":
        return f"KV audit: ok{reason} · {floor_text(audit.get('floor'))}"
    return f"KV audit: {status}{reason}"


def kv_tally(arm: dict) -> str:
    """'CORRUPT×2 · EXACT×2': the arm's probes counted by KV verdict, findings first; '—' when none was audited."""
    counts: dict[str, int] = {}
    for probe in arm.get("probes") or []:
        verdict = kv_verdict(probe)
        if verdict is not None:
            counts[verdict] = counts.get(verdict, 0) + 1
    order = [v for v in KV_TALLY_ORDER if v in counts] + sorted(v for v in counts if v not in KV_TALLY_ORDER)
    return " · ".join(f"{v}×{counts[v]}" for v in order) or "—"


def planted_blocks(request: dict) -> list[int]:
    """The prompt blocks the planted-fault connector corrupted on purpose for this request (none for others)."""
    fault = ((request.get("kv_transfer_params") or {}).get("planted_fault")) or {}
    blocks = fault.get("faulted_blocks") if isinstance(fault, dict) else None
    return (
        sorted({b for b in blocks if isinstance(b, int) and not isinstance(b, bool)})
        if isinstance(blocks, list)
        else []
    )


def corrupt_blocks(audit: dict) -> list[int]:
    """The prompt blocks of a reuse request's audit with at least one corrupt cell (absolute block numbers)."""
    first = int(audit.get("first_block") or 0)
    planes = audit.get("planes") or {}
    found = set()
    for plane in planes.values() if isinstance(planes, dict) else ():
        for row in (plane or {}).get("class") or []:
            found.update(first + i for i, c in enumerate(str(row)) if c == CELL_CORRUPT)
    return sorted(found)


def blamed_chunks(audit: dict) -> list[dict]:
    """A reuse's corrupt cells grouped by runs of adjacent blocks: each chunk's blocks, the layers
    and planes with a corrupt cell there, its number of corrupt cells, the largest relative error
    (None: one is not finite) and what the cells' bytes equal where the audit found it."""
    if not isinstance(audit, dict) or audit.get("status") != "audited":
        return []
    first = int(audit.get("first_block") or 0)
    matches = {(m.get("layer"), m.get("plane"), m.get("block")): m.get("source") for m in audit.get("matches") or []}
    cells = []  # (block, layer, plane, rel)
    for name, plane in sorted((audit.get("planes") or {}).items()):
        for layer, row in enumerate(plane.get("class") or []):
            rels = (plane.get("rel") or [])[layer] if layer < len(plane.get("rel") or []) else []
            cells += [
                (first + i, layer, name, rels[i] if i < len(rels) else None)
                for i, c in enumerate(str(row))
                if c == CELL_CORRUPT
            ]
    chunks = []
    for a, b in spans([c[0] for c in cells]):
        inside = [c for c in cells if a <= c[0] <= b]
        rels = [c[3] for c in inside]
        sources = [matches[(layer, p, blk)] for blk, layer, p, _ in inside if (layer, p, blk) in matches]
        chunks.append(
            {
                "blocks": list(range(a, b + 1)),
                "layers": sorted({c[1] for c in inside}),
                "planes": sorted({c[2] for c in inside}),
                "max_rel": None if any(r is None for r in rels) else max(rels),
                "cells": len(inside),
                "sources": [str(s) for s in sources],  # one per corrupt cell whose bytes the audit matched
            }
        )
    return chunks


# --- The conditions a verdict was measured under (issue 18): the GPU, who shared it, LMCache's copy
# path, repeated trials and the re-run alone. Every key is optional: a report without them shows none
# of this, and every function below returns "" (or nothing) for it.

NOT_RECORDED = "not recorded"
# The classes the report's trials and confirmation carry (schemas/report.schema.json, repro.trials).
EVERY_TRIAL, INTERMITTENT, CLEAN_RATE = "every trial", "intermittent", "none"
DETERMINISTIC, CONTENTION_DEPENDENT = "deterministic", "contention-dependent"
REPRODUCED_VARYING, NOT_REPRODUCED, UNCONFIRMED = "reproduced, varying", "not reproduced", "unconfirmed"
CONFIRMATION_MEANING = {
    DETERMINISTIC: "reproduced when re-run alone",
    REPRODUCED_VARYING: "wrong again when re-run alone, with other first diffs or KV blame",
    CONTENTION_DEPENDENT: "clean when re-run alone, so it needed the shared device",
    NOT_REPRODUCED: "not found again when re-run alone",
    UNCONFIRMED: "the re-run alone decided nothing",
}
SHARER_NOUNS = {"arm": ("arm", "arms"), "lmcache-server": ("MP server", "MP servers")}


def show(value: object) -> str:
    """One scalar or structure as deterministic text; strings as they are."""
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def flatten(data: object, prefix: str = "") -> list[tuple[str, str]]:
    """Nested dicts as sorted dotted keys; lists and scalars printed whole."""
    if isinstance(data, dict) and data:
        out: list[tuple[str, str]] = []
        for key in sorted(data):
            out.extend(flatten(data[key], f"{prefix}.{key}" if prefix else str(key)))
        return out
    return [(prefix, show(data))]


def seconds(value: object, unit: bool = True) -> str:
    """'40.1 s', '61 s' ('40.1' without the unit); '?' when not a number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "? s" if unit else "?"
    return f"{round(value, 1):g}" + (" s" if unit else "")


ARM_CONDITION_KEYS = ("gpu", "sharing", "copy_paths", "trials", "confirmation")


def has_arm_conditions(arm: dict) -> bool:
    """The arm records something of what it was measured under (older reports record none of it)."""
    return any(k in arm for k in ARM_CONDITION_KEYS) or bool(arm_copy_paths(arm))


def arm_copy_paths(arm: dict) -> list[dict]:
    """The arm's copy_paths, else its lmcache.copy_paths (the same list); [] for an arm without LMCache."""
    paths = arm.get("copy_paths")
    if paths is None and isinstance(arm.get("lmcache"), dict):
        paths = arm["lmcache"].get("copy_paths")
    return [p for p in paths or [] if isinstance(p, dict)]


def copy_path_text(arm: dict) -> str:
    """'engine compiled (wheel), MP server fallback': the copy path each LMCache process took; '' when
    the arm records none (not an LMCache arm, or a report made before they were recorded)."""
    paths = arm_copy_paths(arm)
    return ", ".join(
        f"{p.get('process', '?')} {p.get('path') or NOT_RECORDED}" + (f" ({p['source']})" if p.get("source") else "")
        for p in paths
    )


def gpu_text(arm: dict) -> str:
    """'NVIDIA H200 (GPU 0, compute capability 9.0)'; 'CPU' when the arm ran on none; '' when not recorded."""
    if "gpu" not in arm:
        return ""
    gpu = arm["gpu"]
    if not isinstance(gpu, dict):
        return "CPU"
    where = [f"GPU {gpu['visible']}" if gpu.get("visible") not in (None, "") else ""]
    where.append(f"compute capability {gpu['compute_capability']}" if gpu.get("compute_capability") else "")
    detail = ", ".join(w for w in where if w)
    return str(gpu.get("name") or "GPU") + (f" ({detail})" if detail else "")


def _sharers(sharing: dict) -> list[dict]:
    """The processes that count as sharing: all but the arm's own MP server."""
    return [o for o in sharing.get("others") or [] if isinstance(o, dict) and not o.get("own")]


def _count_sharers(others: list[dict]) -> str:
    """'3 arms', '2 arms, 1 MP server and the gpu-load'."""
    counts: dict[str, int] = {}
    order = {"arm": 0, "lmcache-server": 1, "gpu-load": 2}
    for o in sorted(others, key=lambda o: order.get(str(o.get("kind")), 3)):
        counts[str(o.get("kind"))] = counts.get(str(o.get("kind")), 0) + 1
    parts = [
        "the gpu-load" if kind == "gpu-load" else f"{n} {SHARER_NOUNS.get(kind, (kind, kind))[n != 1]}"
        for kind, n in counts.items()
    ]
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + f" and {parts[-1]}"


def sharing_text(arm: dict) -> str:
    """'shared GPU 0 with 3 arms (max overlap 40.1 s)' or 'alone on GPU 0'; '' when not recorded."""
    sharing = arm.get("sharing")
    if not isinstance(sharing, dict):
        return ""
    resource = sharing.get("resource") or "?"
    others = _sharers(sharing)
    if not sharing.get("shared") or not others:
        return f"alone on {resource}"
    longest = max((o.get("overlap_s") or 0 for o in others), default=0)
    return f"shared {resource} with {_count_sharers(others)} (max overlap {seconds(longest)})"


def sharing_overlaps(arm: dict) -> list[str]:
    """Every other process on the arm's device while it ran, with its overlap: 'arm native: 40.1 s',
    'LMCache MP server of X: 61 s (the arm's own)'."""
    sharing = arm.get("sharing")
    if not isinstance(sharing, dict):
        return []
    return [
        f"{o.get('process', '?')}: {seconds(o.get('overlap_s'))}" + (" (the arm's own)" if o.get("own") else "")
        for o in sharing.get("others") or []
        if isinstance(o, dict)
    ]


def sharing_window(arm: dict) -> str:
    """'3.1–64.3 s into the run'; '' when not recorded."""
    window = (arm.get("sharing") or {}).get("window_s") if isinstance(arm.get("sharing"), dict) else None
    if not isinstance(window, list) or len(window) != 2:
        return ""
    return f"{seconds(window[0], unit=False)}–{seconds(window[1])} into the run"


def trial_rates(arm: dict) -> list[dict]:
    trials = arm.get("trials")
    return [r for r in (trials.get("rates") or []) if isinstance(r, dict)] if isinstance(trials, dict) else []


def rate_cell(rate: dict) -> str:
    """'FAIL 3/5', 'FAIL 0/5, KV CORRUPT 2/5': how many of the trials found each kind of finding."""
    of = rate.get("of", "?")
    text = f"FAIL {rate.get('failed', '?')}/{of}"
    return text + (f", KV CORRUPT {rate['kv_corrupt']}/{of}" if rate.get("kv_corrupt") else "")


def trial_rate_text(arm: dict) -> str:
    """'chat-511 FAIL 3/5 intermittent; chat-513 FAIL 5/5 every trial; clean 5/5: fixture, chat-512';
    '' when the arm ran once (no trials)."""
    rates = trial_rates(arm)
    found = [f"{r.get('probe')} {rate_cell(r)} {r.get('class')}" for r in rates if r.get("class") != CLEAN_RATE]
    clean = [str(r.get("probe")) for r in rates if r.get("class") == CLEAN_RATE]
    if clean:
        found.append(f"clean {rates[0].get('of', '?')}/{rates[0].get('of', '?')}: {', '.join(clean)}")
    return "; ".join(found)


def _has_finding(run: dict) -> bool:
    return any(
        isinstance(p, dict) and (p.get("verdict") == FAIL or p.get("kv") == CORRUPT) for p in run.get("probes") or []
    )


def trials_found(arm: dict) -> tuple[int, int] | None:
    """(trials that found something, trials): None without trials."""
    trials = arm.get("trials")
    if not isinstance(trials, dict):
        return None
    runs = [r for r in trials.get("runs") or [] if isinstance(r, dict)]
    return sum(1 for r in runs if _has_finding(r)), int(trials.get("n") or len(runs))


def run_probe_text(probe: dict) -> str:
    """One probe of one run: 'FAIL @6,7', 'PASS', 'PASS · KV CORRUPT'."""
    seen: list[int] = []
    for d in probe.get("first_diffs") or []:
        if d is not None and d not in seen:
            seen.append(d)
    text = str(probe.get("verdict")) + (" @" + ",".join(map(str, seen)) if seen else "")
    return text + (f" · KV {probe['kv']}" if probe.get("kv") == CORRUPT else "")


def trial_diffs_text(arm: dict, probe_name: str) -> str:
    """A probe across the trials: '#1 FAIL @6,7 (shared) · #2 PASS (shared) · #3 ERROR (timeout)'."""
    trials = arm.get("trials")
    parts = []
    for run in (trials.get("runs") or []) if isinstance(trials, dict) else []:
        probe = next((p for p in run.get("probes") or [] if p.get("name") == probe_name), None)
        text = run_probe_text(probe) if probe else str(run.get("verdict"))
        if run.get("error"):
            text += f" ({run['error'].get('kind')})"
        parts.append(f"#{run.get('trial')} {text}" + (" (shared)" if run.get("shared") else ""))
    return " · ".join(parts)


def confirmation_class(arm: dict) -> str | None:
    """The class the re-run alone gave the arm's finding; None when it did not run (or decided no class)."""
    conf = arm.get("confirmation")
    return conf.get("class") if isinstance(conf, dict) and conf.get("status") == "ran" else None


def confirmation_text(arm: dict) -> str:
    """'re-run alone: PASS → contention-dependent', 're-run alone: skipped (--no-confirm)',
    're-run alone: not needed (…)'; '' when the report has no confirmation for the arm."""
    conf = arm.get("confirmation")
    if not isinstance(conf, dict):
        return ""
    if conf.get("status") != "ran":
        return f"re-run alone: {conf.get('status')}" + (f" ({conf['why']})" if conf.get("why") else "")
    verdict = (conf.get("run") or {}).get("verdict") or "no result"
    return f"re-run alone: {verdict} → {conf.get('class') or 'unclassed'}"


def confirmation_reason(arm: dict) -> str:
    """Why the arm was re-run alone and what that run said: 'ran because shared GPU 0 with …; alone: PASS 4/4 (…)'."""
    conf = arm.get("confirmation")
    if not isinstance(conf, dict) or conf.get("status") != "ran":
        return ""
    parts = [f"ran because {conf['why']}" if conf.get("why") else "", str(conf.get("reason") or "")]
    return "; ".join(p for p in parts if p)


def finding_class_text(arm: dict) -> str:
    """What qualifies the arm's verdict: 'intermittent: findings in 3/5 trials', 'findings in 5/5 trials',
    'contention-dependent: clean when re-run alone, …'; '' when neither trials nor a re-run alone say anything."""
    parts = []
    found = trials_found(arm)
    if found and found[0]:
        k, n = found
        parts.append(f"{INTERMITTENT}: findings in {k}/{n} trials" if k < n else f"findings in {k}/{n} trials")
    cls = confirmation_class(arm)
    if cls:
        parts.append(f"{cls}: {CONFIRMATION_MEANING.get(cls, 'see the re-run alone')}")
    return " · ".join(parts)


@dataclass(frozen=True)
class ConditionMark:
    """One mark beside a FAIL: its text, and whether it weakens the finding (intermittent, needed the shared device)."""

    text: str
    qualifies: bool


def probe_condition_marks(arm: dict, probe: dict) -> tuple[ConditionMark, ...]:
    """The marks beside a probe's FAIL (or KV CORRUPT): 'intermittent 3/5', '5/5 trials', 'contention-dependent'."""
    if probe.get("verdict") != FAIL and kv_verdict(probe) != CORRUPT:
        return ()
    marks = []
    rate = next((r for r in trial_rates(arm) if r.get("probe") == probe.get("name")), None)
    if rate and rate.get("class") != CLEAN_RATE:
        hits, of = max(rate.get("failed") or 0, rate.get("kv_corrupt") or 0), rate.get("of", "?")
        intermittent = rate.get("class") == INTERMITTENT
        marks.append(
            ConditionMark(f"{INTERMITTENT} {hits}/{of}" if intermittent else f"{hits}/{of} trials", intermittent)
        )
    cls = confirmation_class(arm)
    if cls:
        marks.append(ConditionMark(cls, cls != DETERMINISTIC))
    return tuple(marks)


def probe_marks_text(arm: dict, probe: dict) -> str:
    """'intermittent 3/5, contention-dependent'; '' when nothing qualifies the probe's verdict."""
    return ", ".join(m.text for m in probe_condition_marks(arm, probe))


def report_conditions(report: dict) -> dict | None:
    conditions = report.get("conditions")
    return conditions if isinstance(conditions, dict) else None


def lmcache_ops_text(report: dict) -> str:
    """'fallback (path fallback, LMCache 0.5.4, torch 2.11.0+cu130, sm 9.0; forced: …)': the --lmcache-ops
    choice, then what the provenance's lmcache_ops says ran (the full record, the build's manifest
    with it, stays in the JSON); '' when the report records neither."""
    mode = (report_conditions(report) or {}).get("lmcache_ops")
    ops = report.get("provenance", {}).get("lmcache_ops")
    if mode is None and not (isinstance(ops, dict) and ops):
        return ""
    if not isinstance(ops, dict) or not ops:
        return str(mode)
    labels = (("path", "path "), ("source", ""), ("lmcache", "LMCache "), ("torch", "torch "), ("arch", "sm "))
    parts = [f"{label}{ops[key]}" for key, label in labels if ops.get(key) not in (None, "")]
    detail = ops.get("detail")
    text = ", ".join(parts) + (f"; {detail}" if isinstance(detail, str) and detail else "")
    return f"{mode or NOT_RECORDED}" + (f" ({text})" if text else "")


def _load_device_text(device: dict, named: bool) -> str:
    """'NVIDIA H200 float16 n 8192, 1234 iterations, 610 TFLOPS' ('GPU 1: …' when named, for several GPUs)."""
    where = f"GPU {device['gpu']}: " if named and device.get("gpu") not in (None, "") else ""
    n, iterations = (device.get(k) for k in ("n", "iterations"))
    figures = [f"n {'?' if n is None else n}", f"{'?' if iterations is None else iterations} iterations"]
    if isinstance(device.get("tflops"), (int, float)):
        figures.append(f"{device['tflops']:g} TFLOPS")
    return f"{where}{device.get('name') or '?'} {device.get('dtype') or '?'} " + ", ".join(figures)


def gpu_load_text(report: dict) -> str:
    """'GPU 0: NVIDIA H200 float16 n 8192, 1234 iterations, 610 TFLOPS; 3.1–180.2 s into the run'; 'none'.
    A load that died while the arms ran says so."""
    load = (report_conditions(report) or {}).get("gpu_load")
    if not isinstance(load, dict):
        return "none"
    found = [d for d in load.get("devices") or [] if isinstance(d, dict)]
    devices = [_load_device_text(d, named=len(found) > 1) for d in found]
    gpus = ", ".join(str(g) for g in load.get("gpus") or []) or "?"
    span = f"{seconds(load.get('started_s'), unit=False)}–{seconds(load.get('ended_s'))} into the run"
    failure = load.get("failure") if isinstance(load.get("failure"), dict) else None
    text = f"on GPU {gpus}: " + ("; ".join(devices) or "no device reported") + f"; {span}"
    return text + (f"; {failure.get('kind')}: {failure.get('detail')}" if failure else "")


def conditions_pairs(report: dict) -> list[tuple[str, str]]:
    """The run's conditions as (name, text): trials, re-run alone, lmcache-ops, gpu-load; [] when not recorded."""
    conditions = report_conditions(report)
    ops = lmcache_ops_text(report)
    if conditions is None and not ops:
        return []
    conditions = conditions or {}
    pairs = [("trials", show(conditions.get("trials", NOT_RECORDED)))]
    confirm = conditions.get("confirm")
    pairs.append(("re-run alone", NOT_RECORDED if confirm is None else "on" if confirm else "off (--no-confirm)"))
    pairs.append(("lmcache-ops", ops or NOT_RECORDED))
    pairs.append(("gpu-load", gpu_load_text(report) if "gpu_load" in conditions else NOT_RECORDED))
    return pairs


def conditions_line(report: dict) -> str:
    """'conditions: trials 5 · re-run alone on · lmcache-ops auto (…) · gpu-load none'; '' when not recorded."""
    pairs = conditions_pairs(report)
    return "conditions: " + " · ".join(f"{k} {v}" for k, v in pairs) if pairs else ""


def qualified(arm: dict) -> bool:
    """The arm's finding did not show every time, or not alone: a claim of it must carry its class."""
    found = trials_found(arm)
    intermittent = found is not None and 0 < found[0] < found[1]
    return intermittent or confirmation_class(arm) in (
        REPRODUCED_VARYING,
        CONTENTION_DEPENDENT,
        NOT_REPRODUCED,
        UNCONFIRMED,
    )


def conditions_warning(report: dict) -> str:
    """What a headline must say when a finding it reports was intermittent or needed a shared device:
    'LMCacheConnectorV1: FAIL (decisive: 6) · contention-dependent: clean when re-run alone, …'; '' otherwise."""
    return "; ".join(f"{arm_title(a)}: {arm_verdict_text(a)}" for a in report["arms"] if qualified(a))
