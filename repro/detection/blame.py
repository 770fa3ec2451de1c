"""The detection matrix's KV audit column: the blocks each probe's audit blamed against the blocks the
planted connector faulted, and the no-fault controls' false blames (pure, no I/O).

The verdicts are the verifier's own: repro.judge.kvaudit.annotate classes every block x layer x K/V plane a
reuse read against the arm's floor (the largest relative error of the arm's own cold prefills' KV
against the baseline's) and decides each probe's KV verdict. A block is blamed when any of its cells is a
finding: corrupt, foreign (another prompt's KV) or misplaced (this prompt's KV from another block or plane),
as the probe's KV verdict blames it. This module only compares the blamed blocks with the planted ones and
counts.
"""

from __future__ import annotations

from repro.contract.result import ArmResult
from repro.judge import kvaudit
from repro.judge.kv_verdict import FINDING_OF
from repro.judge.verdict import FAIL, KV_FINDINGS, KV_VERDICTS, UNAVAILABLE
from repro.readmodel import Request, RequestAudit

# exact: the blamed blocks are the planted blocks; over: a strict superset; under: a strict subset
# (none blamed included); other: neither; unavailable: the audit saw nothing to judge; reported: none blamed, and
# the blocks the connector reported to vLLM as not loaded are the planted blocks (a failure vLLM was told of).
OUTCOMES = ("exact", "over", "under", "other", "unavailable", "reported")
NO_AUDIT = "the arm recorded no KV audit"
# a reuse vLLM finished with an error comes back without kv_transfer_params (vLLM 0.28's Scheduler.update_from_output)
NO_PLANTED = "a reuse came back without the connector's report (kv_transfer_params): its planted blocks are unknown"


def drop_unreferenced(job: dict, baseline_probes: set[str]) -> dict:
    """repro.judge.kvaudit.compare_job's job without the requests of probes the baseline never ran (a fault
    arm's decoy): they have no reference, and a decoy is cold-only anyway."""
    arms = [{**a, "requests": [r for r in a["requests"] if r["probe"] in baseline_probes]} for a in job["arms"]]
    return {**job, "arms": arms}


def blamed_blocks(request_audit: dict | None) -> list[int] | None:
    """The blocks with any finding cell (corrupt, foreign, misplaced) in one reuse request's audit, those its connector
    reported to vLLM as not loaded left out (repro.readmodel.RequestAudit.blamed_blocks); None: nothing was audited."""
    if not request_audit or request_audit.get("planes") is None:
        return None
    return list(RequestAudit(request_audit).blamed_blocks)


def reported_blocks(request_audit: dict | None) -> list[int] | None:
    """The blocks of one reuse the connector reported to vLLM as not loaded (get_block_ids_with_load_errors), which
    the audit reads but never blames (None: nothing was audited)."""
    if not request_audit or request_audit.get("planes") is None:
        return None
    return list(RequestAudit(request_audit).reported_blocks)


def blamed_classes(request_audit: dict | None) -> list[str] | None:
    """The finding cells' classes in one reuse request's audit, worst first (None: nothing was audited)."""
    if not request_audit or request_audit.get("planes") is None:
        return None
    found = {c for plane in request_audit["planes"].values() for row in plane["class"] for c in row}
    return [c for c in FINDING_OF if c in found]


def audit_probes(
    name: str, mode: str, result: dict, probes: list[str], raw: dict | None, problem: str | None, block_size: int
) -> tuple[dict, dict[str, dict]]:
    """The arm's audit status (status, reason, floor) and, per probe in `probes`, the verifier's KV
    verdict with its reasons and blame, the blocks each reuse request's audit blamed (any finding cell) and the
    classes of those cells, and the
    other prompts whose blocks it found in each reuse (served_from: what its wrong bytes equal)."""
    by_name = {p["name"]: p for p in result["probes"]}
    shim = {
        "name": name,
        "mode": mode,
        "probes": [{"name": n, "requests": [{} for _ in by_name[n]["requests"]]} for n in probes],
    }
    kvaudit.annotate([shim], {name: ArmResult.from_json(result)}, raw, problem, block_size)
    status = shim["kv_audit"] or {"status": "unavailable", "reason": NO_AUDIT, "floor": None}
    out = {}
    for p in shim["probes"]:
        kv = p["kv"] or {"verdict": UNAVAILABLE, "reasons": [NO_AUDIT], "blame": None}
        reuses = p["requests"][1:]
        out[p["name"]] = {
            **kv,
            "blamed_blocks": [blamed_blocks(r["kv_audit"]) for r in reuses],
            "blamed_classes": [blamed_classes(r["kv_audit"]) for r in reuses],
            "reported_blocks": [reported_blocks(r["kv_audit"]) for r in reuses],
            # the study's prompts load at most 28 blocks: layers 0 and 1 (112 cells) always fit in the matches
            # the report keeps (repro.judge.kvaudit.MATCHES_KEPT), so no prompt's KV goes unnamed for want of room
            "served_from": [list(Request.from_json(r).audit_source_probes) for r in reuses],
        }
    arm = {k: status.get(k) for k in ("status", "reason", "floor")}
    return arm, out


def blame_outcome(blamed: set[int], planted: set[int]) -> str:
    if blamed == planted:
        return "exact"
    if blamed > planted:
        return "over"
    if blamed < planted:
        return "under"
    return "other"


def probe_blame(
    kv: dict, planted: list[list[int] | None], tokens_changed: bool, unchanged: list[list[int]] | None = None
) -> dict:
    """One fault probe's audit column: blamed exactly iff, for every reuse request, the blocks with a finding
    cell (corrupt, foreign, misplaced) are the blocks the planted connector faulted for that request, less those its
    own load audit measured unchanged (`unchanged`, per reuse: faulted yet holding the right bytes, so no audit can
    blame them). A reuse whose planted blocks are unknown (None: no report came back) cannot be blamed exactly:
    unavailable. "reported" compares what the connector reported to vLLM with everything it faulted."""
    blamed, reported = kv["blamed_blocks"], kv.get("reported_blocks") or ()
    faulted_sets = [set(p or ()) for p in planted]
    unchanged_sets = [set(u) for u in unchanged] if unchanged and len(unchanged) == len(planted) else []
    planted_sets = [f - u for f, u in zip(faulted_sets, unchanged_sets)] if unchanged_sets else faulted_sets
    unknown = any(p is None for p in planted)
    if kv["verdict"] == UNAVAILABLE or unknown or any(b is None for b in blamed) or len(blamed) != len(planted):
        outcome = "unavailable"
    elif not any(blamed) and any(reported) and [set(r or ()) for r in reported] == faulted_sets:
        outcome = "reported"
    else:
        per = [blame_outcome(set(b), p) for b, p in zip(blamed, planted_sets)]
        outcome = next((o for o in per if o != "exact"), "exact")
    return {
        "verdict": kv["verdict"],
        "reasons": kv["reasons"],
        "blame": kv["blame"],
        "blamed_blocks": blamed,
        **({"blamed_classes": kv["blamed_classes"]} if "blamed_classes" in kv else {}),
        "planted_blocks": [None if p is None else sorted(s) for p, s in zip(planted, planted_sets)],
        **({"unchanged_blocks": [sorted(u) for u in unchanged_sets]} if any(unchanged_sets) else {}),
        **({"reported_blocks": kv["reported_blocks"]} if any(kv.get("reported_blocks") or ()) else {}),
        "outcome": outcome,
        **({"planted_unknown": NO_PLANTED} if unknown else {}),
        "tokens_changed": tokens_changed,
        "served_from": kv.get("served_from"),
    }


def planted_fault(request: dict) -> dict:
    """What the planted connector reported for one request (kv_transfer_params["planted_fault"])."""
    return (request.get("kv_transfer_params") or {}).get("planted_fault") or {}


def _absent(status: str, reason: str) -> dict:
    return {"status": status, "reason": reason, "floor": None}


def fault_blame(entry: dict, result: dict | None, name: str, raw: dict | None, problem: str | None, bs: int) -> None:
    """Fill one fault entry's audit column in place: probes[].kv and kv_blame (the cell)."""
    if entry["error"] is not None or result is None:
        entry["kv_blame"] = dict(fault_cell([]), **_absent("error", "the arm failed: nothing to audit"))
        return
    arm, kv = audit_probes(name, "connector", result, [p["name"] for p in entry["probes"]], raw, problem, bs)
    by_name = {p["name"]: p for p in result["probes"]}
    for row in entry["probes"]:
        reuses = by_name[row["name"]]["requests"][1:]
        planted = [planted_fault(r).get("faulted_blocks") for r in reuses]
        row["kv"] = probe_blame(kv[row["name"]], planted, FAIL in row["verdicts"].values(), unchanged_of(row, reuses))
    entry["kv_blame"] = dict(fault_cell(entry["probes"]), **arm)


def unchanged_of(row: dict, reuses: list[dict]) -> list[list[int]] | None:
    """Per reuse, the faulted blocks the planted connector's load audit measured unchanged (unchanged_blocks of the
    probe's load line, repro.detection.matrix.fault_entry's kv_audit): read where the probe has one reuse that
    loaded once (its line is then that load's), else None (every faulted block counts)."""
    line, report = row.get("kv_audit"), planted_fault(reuses[0]) if len(reuses) == 1 else {}
    if not line or not report.get("loaded_tokens") or "loads" in report:
        return None
    return [list(line.get("unchanged_blocks") or ())]


def fault_cell(probes: list[dict]) -> dict:
    """One (fault, position)'s audit column over its probes."""
    by = {o: [p for p in probes if p["kv"]["outcome"] == o] for o in OUTCOMES}
    exact, n = len(by["exact"]), len(probes)
    return {
        "cell": "detected" if n and exact == n else "partial" if exact else "missed" if n else "error",
        "probes": n,
        "blamed_exactly": exact,
        "over": [p["name"] for p in by["over"]],
        "under": [p["name"] for p in by["under"]],
        "other": [p["name"] for p in by["other"]],
        "unavailable": [
            {"probe": p["name"], "reason": p["kv"].get("planted_unknown") or "; ".join(p["kv"]["reasons"])}
            for p in by["unavailable"]
        ],
        "tokens_unchanged": [p["name"] for p in probes if not p["kv"]["tokens_changed"]],
        "tokens_unchanged_blamed_exactly": [p["name"] for p in by["exact"] if not p["kv"]["tokens_changed"]],
    }


def control_blame(
    entry: dict, result: dict | None, name: str, mode: str, raw: dict | None, problem: str | None, bs: int
) -> None:
    """Fill one control entry's audit column in place: probes[].kv and kv_blame. With no fault
    planted, any KV finding (CORRUPT, FOREIGN, MISPLACED) is a false blame."""
    if entry["error"] is not None or result is None:
        entry["kv_blame"] = dict(control_cell([]), **_absent("error", "the arm failed: nothing to audit"))
        return
    arm, kv = audit_probes(name, mode, result, [p["name"] for p in entry["probes"]], raw, problem, bs)
    for row in entry["probes"]:
        row["kv"] = kv[row["name"]]
    entry["kv_blame"] = dict(control_cell(entry["probes"]), **arm)


def control_cell(probes: list[dict]) -> dict:
    verdicts = {v: sum(p["kv"]["verdict"] == v for p in probes) for v in KV_VERDICTS}
    return {
        "probes": len(probes),
        "verdicts": verdicts,
        "false_blames": [
            {"probe": p["name"], "verdict": p["kv"]["verdict"], "blame": (p["kv"]["blame"] or {}).get("text")}
            for p in probes
            if p["kv"]["verdict"] in KV_FINDINGS
        ],
        "unavailable": [
            {"probe": p["name"], "reason": "; ".join(p["kv"]["reasons"])}
            for p in probes
            if p["kv"]["verdict"] == UNAVAILABLE
        ],
    }


def summarize_blame(faults: list[dict], controls: list[dict]) -> dict:
    """The audit column's totals; `present` is false for a matrix made before the audit (schema 1).

    ok: every fault probe blamed exactly, no control false blame and no control probe unaudited."""
    cells = [f for f in faults if "kv_blame" in f]
    checks = [c for c in controls if "kv_blame" in c]
    if not cells and not checks:
        return {"present": False, "ok": True}
    probes = sum(f["kv_blame"]["probes"] for f in cells)
    exact = sum(f["kv_blame"]["blamed_exactly"] for f in cells)
    mismatches = [
        f"{f['fault']}/{f['position']}:{p['name']}:{p['kv']['outcome']}"
        for f in cells
        for p in f["probes"]
        if p["kv"]["outcome"] != "exact"
    ]
    false_blames = sum(len(c["kv_blame"]["false_blames"]) for c in checks)
    unavailable = sum(len(c["kv_blame"]["unavailable"]) for c in checks)
    return {
        "present": True,
        "fault_probes": probes,
        "blamed_exactly": exact,
        "by_fault": {
            f"{f['fault']}/{f['position']}": [f["kv_blame"]["blamed_exactly"], f["kv_blame"]["probes"]] for f in cells
        },
        "mismatches": mismatches,
        "tokens_unchanged": sum(len(f["kv_blame"]["tokens_unchanged"]) for f in cells),
        "tokens_unchanged_blamed_exactly": sum(len(f["kv_blame"]["tokens_unchanged_blamed_exactly"]) for f in cells),
        "false_blames": false_blames,
        "control_unavailable": unavailable,
        "ok": probes > 0 and exact == probes and false_blames == 0 and unavailable == 0,
    }
