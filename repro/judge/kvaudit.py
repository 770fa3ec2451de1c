"""The KV audit, parent side: which requests to compare, and what the figures mean for the report.

The engine side records (repro.engine.kvaudit) and compares (repro.engine.kvcompare); this module
builds the comparison's job from the arms' results (repro.run.kvaudit runs it as a child) and turns its
raw figures into the report's fields: per reuse request a class per block x layer x K/V plane
(repro.judge.kv_verdict.classify_kv_cell against the arm's measured floor), per probe a KV verdict
(repro.judge.kv_verdict.decide_kv_probe) with the blamed blocks, layers and planes. The floor of an arm is
the largest relative error of its own cold prefills' KV against the baseline's: how far the same
computation drifted between two processes, measured in this run, never a constant.
"""

from __future__ import annotations

import re

from repro.contract.result import ArmResult
from repro.judge.evaluate import served_prompts
from repro.judge.kv_grid import compact_plane
from repro.judge.kv_shape import describe
from repro.judge.kv_verdict import (
    CELL_CORRUPT,
    CELL_FOREIGN,
    CELL_MISPLACED,
    COUNT_NAMES,
    KVRequestAudit,
    KVVerdict,
    Source,
    classify_kv_cell,
    decide_kv_probe,
    decide_kv_unavailable,
)
from repro.judge.wording import blocks_text, span_text

PLANES = ("K", "V")
# What a reuse's wrong bytes equal is kept for this many cells at most, in the comparison's order (layer 0
# first): a long prompt's deeper layers may be left out (repro.readmodel.RequestAudit.sources_complete reads this).
MATCHES_KEPT = 200


def _record_ok(record: dict | None) -> str | None:
    """Why a request's audit record cannot be compared (None: it can)."""
    if record is None:
        return "the audit recorded nothing for this request"
    if record.get("unavailable"):
        return str(record["unavailable"])
    if record.get("seq") is None:
        return "the audit recorded nothing for this request"
    return None


def compare_job(baseline: ArmResult, audited: dict[str, ArmResult]) -> dict:
    """The job for repro.engine.kvcompare: the baseline's reference seq per probe and, per arm,
    every request with a usable record (cold: its computed blocks; reuses: their reused blocks)."""
    ref_dir = (baseline.kv_audit or {}).get("dir")
    answers = {p.name: tuple(p.requests[0].token_ids) for p in baseline.probes if p.requests}
    ref_probes = {}
    for p in baseline.probes:
        rec = p.requests[0].kv_audit_record if p.requests else None
        if _record_ok(rec) is None and rec.get("computed_blocks", 0) > 0:
            ref_probes[p.name] = rec["seq"]
    arms = []
    for name, res in audited.items():
        reqs = []
        for p in res.probes:
            for i, r in enumerate(p.requests):
                rec = r.kv_audit_record
                if _record_ok(rec) is not None:
                    continue
                kind = "reused" if rec.get("reused_blocks", 0) > 0 else "computed"
                if (
                    kind == "computed"
                    and (i > 0 or rec.get("computed_blocks", 0) == 0)
                    and not unowned(r, answers, p, i)
                ):
                    continue  # a reuse that reused nothing has nothing to audit; a cold one is the floor
                reqs.append(
                    {"probe": p.name, "index": i, "seq": rec["seq"], "kind": kind, "layers": len(rec["layers"])}
                )
        for prime in (res.kv_audit or {}).get("primes") or []:  # native-matched: part of the floor
            rec = prime.get("record")
            if _record_ok(rec) is None and rec.get("computed_blocks", 0) > 0:
                index = f"prime{prime['reuse']}"
                reqs.append(
                    {
                        "probe": prime["probe"],
                        "index": index,
                        "seq": rec["seq"],
                        "kind": "computed",
                        "layers": len(rec["layers"]),
                    }
                )
        # what a cell's bytes may be named after: the prompts this arm's engine was sent (repro.judge.evaluate)
        between = (res.effective_config or {}).get("between_requests")
        prompts = {p.name: p.prompt_token_ids for p in baseline.probes}
        sources = sorted(served_prompts([p.name for p in res.probes], between, prompts))
        arms.append({"name": name, "dir": (res.kv_audit or {}).get("dir"), "requests": reqs, "sources": sources})
    return {"reference": {"dir": ref_dir, "probes": ref_probes}, "arms": arms}


# What a no-hit reuse's audit is: the blocks it computed itself, read against the baseline's (its tokens differ).
COMPUTED_NOTE = "its counter says 0 and its answer differs: the blocks it computed itself, against the baseline's"


def unowned(request, answers: dict, probe, index: int) -> bool:
    """A reuse (index > 0) whose counter says 0 and whose tokens differ from the baseline's (repro.judge.verdict's
    NO_HIT_DIFFERS): its computed blocks are compared with the baseline's, to see whether they hold its own prefill's
    KV (never part of the arm's floor)."""
    rec = request.kv_audit_record or {}
    base = answers.get(probe.name)
    return (
        index > 0
        and request.cached_tokens == 0
        and base is not None
        and tuple(request.token_ids) != base
        and (rec.get("computed_blocks", 0) > 0)
    )


def _round(x: float | None) -> float | None:
    return None if x is None else float(f"{x:.4g}")


def arm_floor(raw_arm: dict) -> dict:
    """The arm's measured floor: its own prefills' KV against the baseline's, every cell: the cold
    requests', and on native-matched the priming prefills' too (the KV its reuses then read, from a
    prefill of another length than the baseline's). rel is the largest relative error over every cell (the
    arm's summary figure); by_layer the largest of each layer and plane, which each cell is classed against:
    one layer that drifts does not raise the bar of the others."""
    rels, abss, cells, identical = [], [], 0, True
    by_layer: dict[str, list[float]] = {plane: [] for plane in PLANES}
    prefills = [v for per_req in raw_arm.values() for k, v in per_req.items() if k == "0" or k.startswith("prime")]
    for cold in prefills:
        if not cold or cold.get("error") or cold.get("kind") != "computed":
            continue
        for plane in PLANES:
            pl = cold["planes"][plane]
            layers = by_layer[plane]
            for li, (row_i, row_r, row_a) in enumerate(zip(pl["identical"], pl["rel"], pl["max_abs"])):
                layers.extend([0.0] * (li + 1 - len(layers)))
                for same, rel, ab in zip(row_i, row_r, row_a):
                    cells += 1
                    identical = identical and same
                    if not same:
                        rels.append(float("inf") if rel is None else rel)
                        abss.append(float("inf") if ab is None else ab)
                        layers[li] = max(layers[li], rels[-1])
    if cells == 0:
        return {"rel": None, "max_abs": None, "cells": 0, "identical": False}
    worst_rel = max(rels, default=0.0)
    worst_abs = max(abss, default=0.0)
    return {  # unrounded: cells are classed against it (the report shows it rounded, _shown)
        "rel": None if worst_rel == float("inf") else worst_rel,
        "max_abs": None if worst_abs == float("inf") else worst_abs,
        "cells": cells,
        "identical": identical,
        "by_layer": {plane: [None if r == float("inf") else r for r in rows] for plane, rows in by_layer.items()},
    }


def cell_floor(floor: dict, layer: int, plane: str) -> float | None:
    """The floor a cell of this layer and plane is classed against: its layer's and plane's where measured, else
    the arm's one figure."""
    rows = (floor.get("by_layer") or {}).get(plane) or []
    return rows[layer] if layer < len(rows) else floor.get("rel")


def _shown(floor: dict) -> dict:
    """The floor as the report shows it (4 significant digits); never what a cell is classed against."""
    shown = {**floor, "rel": _round(floor["rel"]), "max_abs": _round(floor["max_abs"])}
    if "by_layer" in floor:
        shown["by_layer"] = {plane: [_round(r) for r in rows] for plane, rows in floor["by_layer"].items()}
    return shown


def _cold_entry(raw: dict) -> dict:
    rel = [r for plane in PLANES for row in raw["planes"][plane]["rel"] for r in row]
    ab = [a for plane in PLANES for row in raw["planes"][plane]["max_abs"] for a in row]
    same = all(s for plane in PLANES for row in raw["planes"][plane]["identical"] for s in row)
    return {
        "status": "floor",
        "reason": None,
        "first_block": 0,
        "num_blocks": raw["num_blocks"],
        "layers": raw["layers"],
        "max_rel": None if any(r is None for r in rel) else _round(max(rel, default=0.0)),
        "max_abs": None if any(a is None for a in ab) else _round(max(ab, default=0.0)),
        "identical": same,
    }


def _unavailable(reason: str) -> dict:
    return {
        "status": "unavailable",
        "reason": reason,
        "origin": None,
        "first_block": 0,
        "num_blocks": 0,
        "layers": 0,
        "planes": None,
        "matches": [],
        "counts": dict.fromkeys(COUNT_NAMES.values(), 0),
    }


_SOURCE_TEXT = re.compile(r"^(?:probe (?P<probe>\S+) )?block (?P<block>\d+)(?: \((?P<plane>[KV]) plane\))?$")
_OTHER_PLANE = re.compile(r"^its (?P<plane>[KV]) plane$")


def match_source(match: dict, probe: str) -> Source | None:
    """What a comparison's match says a cell's bytes equal, for the reuse of `probe`: another block of this prompt
    or of another probe's (in its plane or the other), the other plane of its own block, or zeros (probe None).
    The structured fields (repro.engine.kvcompare) when there, else its `source` words, which every comparison
    has written (so the matches kept in a report read the same way)."""
    rel = float(match.get("rel") or 0.0)
    if "src_block" in match:
        src_probe = match.get("probe")
        if src_probe is None:
            return Source(None)
        return Source(src_probe, int(match["src_block"]), match.get("src_plane"), rel)
    text = str(match.get("source") or "")
    if text == "zeros":
        return Source(None)
    if m := _OTHER_PLANE.match(text):
        return Source(probe, int(match["block"]), m["plane"], rel)
    if m := _SOURCE_TEXT.match(text):
        return Source(m["probe"] or probe, int(m["block"]), m["plane"] or match.get("plane"), rel)
    return None


# What the audit says of blocks a connector reported to vLLM as not loaded (get_block_ids_with_load_errors): not a
# silent finding. vLLM's kv_load_failure_policy decides (fail: the request ends in an error; recompute: vLLM discards
# the step that read them and computes from the first of them), and the tokens show what it did.
LOAD_ERRORS_NOTE = (
    "reported to vLLM as not loaded (get_block_ids_with_load_errors): its kv_load_failure_policy decides what "
    "follows and the tokens show it; not a silent finding"
)


def _kept(match: dict) -> dict:
    """A match as the report keeps it: where, and its source in words (which match_source reads back), with its
    relative error when the bytes are near the source rather than equal to it."""
    kept = {k: match[k] for k in ("layer", "plane", "block", "source")}
    return {**kept, "rel": _round(match["rel"])} if match.get("rel") else kept


def reuse_entry(raw: dict, record: dict, floor: dict, probe: str) -> tuple[dict, KVRequestAudit]:
    """One reuse request (of `probe`) its report field and its audit for the verdict: each cell classed
    (repro.judge.kv_verdict.classify_kv_cell against its layer's and plane's floor, arm_floor, with what the
    comparison found its bytes equal) and, where cells are misplaced or foreign, the shape of it
    (repro.judge.kv_shape)."""
    sources = {(m["block"], m["layer"], m["plane"]): match_source(m, probe) for m in raw.get("matches", [])}
    reported = set(record.get("load_errors") or ())  # blocks the connector told vLLM it did not load
    planes, counts = {}, dict.fromkeys(COUNT_NAMES.values(), 0)
    found: dict[str, list] = {CELL_CORRUPT: [], CELL_FOREIGN: [], CELL_MISPLACED: []}
    classed: dict[tuple[int, int, str], tuple[str, Source | None]] = {}
    for plane in PLANES:
        pl = raw["planes"][plane]
        classes = []
        for li, (row_i, row_r) in enumerate(zip(pl["identical"], pl["rel"])):
            at = cell_floor(floor, li, plane)
            row = "".join(
                classify_kv_cell(s, r, at, sources.get((b, li, plane)), probe)
                for b, (s, r) in enumerate(zip(row_i, row_r))
            )
            classes.append(row)
            for b, c in enumerate(row):
                counts[COUNT_NAMES[c]] += 1
                if c in found and b not in reported:
                    found[c].append((b, li, plane))
                    classed[(b, li, plane)] = (c, sources.get((b, li, plane)))
        # the report's compact form (schema_version 3): figures only where not 0, in runs (repro.judge.kv_grid)
        planes[plane] = compact_plane(
            classes,
            [[_round(a) for a in row] for row in pl["max_abs"]],
            [[_round(r) for r in row] for row in pl["rel"]],
        )
    local_blocks = int(record.get("local_tokens", 0)) // max(1, int(record.get("block_size", 1)))
    entry = {
        "status": "audited",
        "reason": None,
        "origin": "local" if local_blocks >= raw["num_blocks"] and raw["num_blocks"] else "external",
        "first_block": 0,
        "num_blocks": raw["num_blocks"],
        "layers": raw["layers"],
        "planes": planes,
        "matches": [_kept(m) for m in raw.get("matches", [])[:MATCHES_KEPT]],
        "counts": counts,
    }
    if reported:  # classed in the grid as read, never a finding: vLLM was told (kv_load_failure_policy decides)
        entry["load_errors"] = {"blocks": sorted(reported), "note": LOAD_ERRORS_NOTE}
    shape = describe(classed, probe, raw["num_blocks"])
    if shape:
        entry["shape"] = shape
    audit = KVRequestAudit(
        True,
        None,
        tuple(found[CELL_CORRUPT]),
        counts["numeric"],
        counts["exact"],
        tuple(found[CELL_MISPLACED]),
        tuple(found[CELL_FOREIGN]),
        shape,
    )
    return entry, audit


def blame(v: KVVerdict, block_size: int) -> dict | None:
    if not v.blocks:
        return None
    tokens = [min(v.blocks) * block_size, (max(v.blocks) + 1) * block_size]
    planes = "+".join(v.planes)
    text = f"{blocks_text(v.blocks, block_size)}, {planes}, layers {span_text(v.layers)}"
    return {
        "blocks": list(v.blocks),
        "layers": list(v.layers),
        "planes": list(v.planes),
        "tokens": tokens,
        "text": text,
    }


def _kv(v: KVVerdict, block_size: int) -> dict:
    return {"verdict": v.verdict, "reasons": list(v.reasons), "blame": blame(v, block_size)}


def annotate(
    entries: list[dict], results: dict[str, ArmResult], raw: dict | None, problem: str | None, block_size: int
) -> None:
    """Fill the report's kv_audit / kv fields in place (entries as repro.run.entries.arm_entry made them)."""
    for entry in entries:
        res = results.get(entry["name"])
        if res is None or res.kv_audit is None:
            entry["kv_audit"] = None
            for p in entry.get("probes", []):
                p["kv"] = None
                for r in p["requests"]:
                    r["kv_audit"] = None
            continue
        records = [r.kv_audit_record for p in res.probes for r in p.requests if r.kv_audit_record]
        first = next((r for r in records if r.get("layout") is not None), records[0] if records else {})
        errors = res.kv_audit.get("errors") or []
        info = {
            "layout": first.get("layout"),
            "kv_shape": first.get("kv_shape"),
            "dtype": first.get("dtype"),
            "layers": len(first.get("layers") or []) or None,
        }
        if entry["mode"] == "baseline":
            reason = (
                "; ".join(
                    e.get("where", "?") + ": " + e.get("error", "").strip().splitlines()[-1][:200] for e in errors
                )
                or None
            )
            entry["kv_audit"] = {"status": "reference", "reason": reason, "floor": None, **info}
            for p in entry["probes"]:
                p["kv"] = None
                for r in p["requests"]:
                    r["kv_audit"] = None
            continue
        raw_arm = (raw or {}).get("arms", {}).get(entry["name"])
        arm_problem = problem if raw_arm is None else None
        if errors:
            last = errors[0].get("error", "").strip().splitlines()
            arm_problem = f"the audit failed in {errors[0].get('where', '?')}: {last[-1][:200] if last else '?'}"
        floor = arm_floor(raw_arm or {})
        entry["kv_audit"] = {
            "status": "unavailable" if arm_problem else "ok",
            "reason": arm_problem,
            "floor": _shown(floor),
            **info,
        }
        by_probe = {p.name: p for p in res.probes}
        for p in entry.get("probes", []):
            probe_res = by_probe.get(p["name"])
            if probe_res is None:  # skipped
                p["kv"] = None
                for r in p["requests"]:
                    r["kv_audit"] = None
                continue
            raw_probe = (raw_arm or {}).get(p["name"], {})
            audits = []
            for i, (r, rr) in enumerate(zip(p["requests"], probe_res.requests)):
                rec = rr.kv_audit_record
                got = raw_probe.get(str(i))
                why = arm_problem or _record_ok(rec) or (got or {}).get("error")
                if i == 0:
                    r["kv_audit"] = _cold_entry(got) if got and not got.get("error") and not arm_problem else None
                    continue
                if why is None and got is None:
                    if (rec or {}).get("reused_blocks", 0) == 0:
                        entry_r, audit = _nothing_reused()
                        r["kv_audit"] = entry_r
                        audits.append(audit)
                        continue
                    why = "the comparison has no figures for this request"
                if why is not None:
                    r["kv_audit"] = _unavailable(why)
                    audits.append(KVRequestAudit(False, why))
                    continue
                r["kv_audit"], audit = reuse_entry(got, rec, floor, p["name"])
                if got.get("kind") == "computed":  # a no-hit reuse's own blocks (unowned), not a load
                    r["kv_audit"].update(origin=None, reason=COMPUTED_NOTE)
                audits.append(audit)
            v = decide_kv_unavailable(arm_problem) if arm_problem else decide_kv_probe(audits, floor["rel"])
            p["kv"] = _kv(v, block_size)
            p["kv"]["reasons"] += [
                f"request {i}: blocks {', '.join(map(str, r['kv_audit']['load_errors']['blocks']))} {LOAD_ERRORS_NOTE}"
                for i, r in enumerate(p["requests"])
                if (r.get("kv_audit") or {}).get("load_errors")
            ]


def _nothing_reused() -> tuple[dict, KVRequestAudit]:
    return _unavailable("no full block was reused: nothing to audit"), KVRequestAudit(True, None)
