"""The P→D report (kind "kvkit-pd-report"): every judged request, the arm's verdict, the controls, provenance.

schema_version 1: first version. Top level: kind, schema_version, tool_version, cases (the file's name, path and
SHA-256), settings, verdict (the arm's: the worst of its probe requests'), reasons, counts, controls, requests (each
judged request in the order sent), baselines (each prompt's cache-off answer), pair (ports, argv, logs) and
provenance (the kit's commit, argv, UTC times, hardware, the engine interpreter's vLLM, torch and NIXL versions).
With --kv-audit, settings.kv_audit is true and each request has kv_audit (repro.judge.pd_kvaudit: its KV verdict,
reason, each received slot's source and the shape sentence); a control's may carry "predicted" (its case's predict).
"""

from __future__ import annotations

from collections import Counter
from pathlib import PurePosixPath

from repro import __version__
from repro.disagg.cases import Cases
from repro.disagg.pair import Run, controls, probe_requests
from repro.errors import EXIT_OK
from repro.judge.pd_verdict import decide_pd_arm
from repro.judge.verdict import ERROR, FAIL, INCONCLUSIVE, KV_FINDINGS, PASS
from repro.plan.interpreter import ask_json
from repro.record.atomic import write_json_atomic
from repro.record.exit_rule import exit_reason
from repro.record.provenance import study_provenance

KIND = "kvkit-pd-report"
ARM = "P→D (NixlConnector)"  # the one arm, as the summary and the exit rule name it
# A request that is not PASS and records no reason says so (repro.publish.summary.NO_REASON, a floor above this one).
NO_REASON = "no reason recorded"
SCHEMA_VERSION = 1
NIXL_DISTS = ("nixl", "nixl-cu12", "nixl-cu13")
# Asked of the engine interpreter in a subprocess: the versions that make a P→D run, whether NIXL's bindings import
# (vLLM imports nixl._api and only warns when it cannot) and whether torch sees a CUDA device.
_PD_PROBE = r"""
import importlib.metadata as m, json, platform, sys
def version(name):
    try:
        return m.version(name)
    except m.PackageNotFoundError:
        return None
out = {"executable": sys.executable, "python": platform.python_version(),
       "packages": {n: version(n) for n in ("vllm", "torch", "nixl", "nixl-cu12", "nixl-cu13", "transformers")}}
try:
    import nixl._api
    out["nixl_importable"] = True
    out["nixl_backend"] = nixl._api.__name__.split(".")[0]  # nixl_cu13 or nixl_cu12: torch's CUDA major picks
except Exception as exc:
    out["nixl_importable"] = False
    out["nixl_problem"] = f"{type(exc).__name__}: {exc}"[:200]
try:
    import torch
    out["cuda_devices"] = torch.cuda.device_count() if torch.cuda.is_available() else 0
except Exception as exc:
    out["cuda_devices"] = 0
    out["cuda_problem"] = f"{type(exc).__name__}: {exc}"[:200]
print(json.dumps(out))
"""


def probe_engine(python: str, timeout_s: float = 180) -> dict:
    """What the engine interpreter holds for a P→D run (never raises; {"problem": ...} when it cannot be asked)."""
    return ask_json([python, "-c", _PD_PROBE], timeout_s, "is not a working Python 3", who=python)


def environment_problem(info: dict) -> str | None:
    """Why this interpreter cannot run a NIXL pair (one line), or None."""
    if "problem" in info:
        return f"the engine interpreter {info['problem']}"
    if not (info.get("packages") or {}).get("vllm"):
        return "vllm is not installed in the engine interpreter"
    if not info.get("nixl_importable"):
        return f"NIXL is not importable there (nixl._api: {info.get('nixl_problem', 'not found')}); install nixl 1.2.0"
    if not info.get("cuda_devices"):
        return "NIXL needs a CUDA GPU: torch in the engine interpreter sees none"
    return None


def provenance(argv: list[str], env: dict, started: str, engine: dict) -> dict:
    """The kit's study provenance with the engine interpreter's versions (NIXL's among them) and what it holds."""
    found = engine.get("packages") or {}
    packages = {n: found.get(n) or "unavailable: not installed" for n in ("vllm", "torch", *NIXL_DISTS)}
    nixl = found.get("nixl-cu13") or found.get("nixl") or "unavailable: not installed"
    return study_provenance(argv, env, started, packages) | {"engine_environment": engine, "nixl": nixl}


def build_report(run: Run, cases: Cases, settings: dict, pair: dict, prov: dict) -> dict:
    probes, ctrls = probe_requests(run), controls(run)
    verdict, reasons = decide_pd_arm([j.verdict.verdict for j in probes], [j.control for j in ctrls])
    return {
        "kind": KIND,
        "schema_version": SCHEMA_VERSION,
        "tool_version": __version__,
        "cases": {"name": cases.name, "path": cases.path, "sha256": cases.sha256},
        "settings": settings,
        "verdict": verdict,
        "reasons": list(reasons),
        "counts": dict(sorted(Counter(j.verdict.verdict for j in probes).items())),
        "controls": {"run": len(ctrls), "held": sum(1 for j in ctrls if j.control.held)},
        "requests": [j.as_dict() for j in run.judged],
        "baselines": {
            n: {
                "token_ids": list(a.token_ids) if a.token_ids else None,
                "cached_tokens": a.cached_tokens,
                "top_gaps": list(a.top_gaps) if a.top_gaps is not None else None,
                "error": a.error,
            }
            for n, a in sorted(run.baselines.items())
        },
        "pair": pair,
        "provenance": prov,
    }


def exit_view(report: dict) -> dict:
    """The P→D report as the kit's one exit rule reads a report (repro.record.exit_rule.exit_reason), so that P→D
    decides no exit code of its own: one arm, ARM, whose verdict is the report's and whose probes are the probe
    requests (repro.disagg.pair.probe_requests), each with its token verdict and its KV audit (a KV finding is exit
    1 as on every arm); an acceptance whose checked items are every probe request (expected PASS: a probe request
    is judged as the kit judges every reuse) and every negative control (expected to hold, as its case states); and,
    as errors, every request outside the controls that ended in ERROR (a consumer's own prefill of the warm prompt
    included). A control's own verdict and KV are what its case judges (its ERROR, FAIL or foreign blocks are the
    fault it hands over on purpose), so neither is a probe here. Pure: a view of the report's data."""
    requests = report.get("requests") or []
    probes = [
        {"name": _request_name(r), "verdict": r["verdict"], "kv": r.get("kv_audit")}
        for r in requests
        if r.get("control") is None and r.get("reference") is not None
    ]
    checked = [_check(p["name"], "tokens", PASS, p["verdict"], p["verdict"] == PASS) for p in probes]
    for r in requests:
        c = r.get("control")
        if c is not None:
            seen = "held" if c.get("held") else f"not held ({c.get('reason')})"
            checked.append(_check(f"{r['case']} (trial {r['trial']})", "control", "held", seen, bool(c.get("held"))))
    errors = [
        {"arm": f"{ARM} {_request_name(r)}", "kind": f"{ERROR} ({(r.get('reasons') or ['no reason'])[0]})"}
        for r in requests
        if r.get("control") is None and r.get("verdict") == ERROR
    ]
    arm = {"name": ARM, "mode": "pd", "verdict": report["verdict"], "reasons": list(report.get("reasons") or []),
           "probes": probes}  # fmt: skip
    acceptance = {"suite": "pd-cases", "matched": bool(checked) and all(c["ok"] for c in checked),
                  "checked": checked, "unchecked_arms": [], "unchecked_probes": []}  # fmt: skip
    return {"complete": True, "arms": [arm], "errors": errors, "acceptance": acceptance}


def _request_name(request: dict) -> str:
    return f"{request['case']} {request['prompt']} (trial {request['trial']})"


def _check(what: str, check: str, expected: str, observed: str, ok: bool) -> dict:
    return {"check": check, "arm": ARM, "probe": what, "expected": expected, "observed": observed, "ok": ok}


def write_report(path: str, report: dict) -> None:
    write_json_atomic(path, report)


# How the headline names the probe requests of a verdict other than PASS (a PASS: "matched caching off")
_WORDS = {FAIL: "answered differently", INCONCLUSIVE: INCONCLUSIVE, ERROR: f"ended in {ERROR}"}


def headline(report: dict) -> str:
    """'P→D (NixlConnector, NIXL 1.2.0, vLLM 0.26.0, NVIDIA H200, kvkit-tiny-qwen3-seed6): matched caching off token
    for token on 21 of 21 probe requests; negative controls held 3 of 6; exit 1: acceptance not matched': the run in
    one sentence, as the verifier's summary leads with one. Its counts are the probe requests the one exit rule reads
    (exit_view) and its end is that rule's code and the head of its reason, so that no PASS stands without the exit."""
    view = exit_view(report)
    code, why = exit_reason(view)
    probes = view["arms"][0]["probes"]
    n = len(probes)
    said = [f"{_WORDS[v]} on {k}" for v in (FAIL, INCONCLUSIVE, ERROR) if (k := sum(p["verdict"] == v for p in probes))]
    if said:
        tokens = ", ".join(said) + f" of {n} probe requests"
    else:
        tokens = f"matched caching off token for token on {n} of {n} probe requests" if n else "no probe request judged"
    if report["verdict"] == ERROR and ERROR not in [p["verdict"] for p in probes]:
        tokens = f"ended in {ERROR}; {tokens}"  # the pair itself failed (repro.disagg.commands)
    kv = [(p.get("kv") or {}).get("verdict") for p in probes]
    found = [f"loaded {cls.lower()} KV on {kv.count(cls)} of {n}" for cls in KV_FINDINGS if cls in kv]
    c = report["controls"]
    parts = [f"{_stack(report)}: {tokens}", *found, f"negative controls held {c['held']} of {c['run']}"]
    return "; ".join([*parts, f"exit {code}: {why.split(': ')[0]}"])


def _stack(report: dict) -> str:
    """'P→D (NixlConnector, NIXL 1.2.0, vLLM 0.26.0, NVIDIA H200, kvkit-tiny-qwen3-seed6)': the model by its folder's
    name, never a machine path; what the report does not record is left out."""
    prov = report.get("provenance") or {}
    pkgs = prov.get("packages") or {}
    nixl, vllm = prov.get("nixl"), pkgs.get("vllm")
    model = PurePosixPath(str((report.get("settings") or {}).get("model") or "")).name
    parts = [f"NIXL {nixl}" if _known(nixl) else "", f"vLLM {vllm}" if _known(vllm) else ""]
    parts += [", ".join((prov.get("hardware") or {}).get("gpus") or []), model]
    return f"P→D ({', '.join(['NixlConnector', *(p for p in parts if p)])})"


def _known(version: object) -> bool:
    return bool(version) and not str(version).startswith("unavailable")


def summary_lines(report: dict) -> list[str]:
    """The run in a few lines: its headline, the arm's verdict, its counts, each control, each request that is not
    PASS or whose KV audit found another prompt's, misplaced or corrupt KV. Where the one exit rule counts something
    against an arm whose tokens PASSed (a KV finding, a control not held), the arm's line says the exit, never a bare
    PASS."""
    counts = ", ".join(f"{v} {n}" for v, n in report["counts"].items()) or "none"
    c = report["controls"]
    code, why = exit_reason(exit_view(report))
    head = report["verdict"] if code == EXIT_OK or report["verdict"] != PASS else f"tokens {PASS}, exit {code}: {why}"
    lines = [headline(report), f"{ARM}: {head} (probe requests: {counts}; controls held {c['held']}/{c['run']})"]
    for r in report["requests"]:
        kv_found = (r.get("kv_audit") or {}).get("verdict") in KV_FINDINGS
        if r["control"] is not None:
            lines.append(f"  control {r['case']} (trial {r['trial']}): {r['control']['reason']}{kv_text(r)}")
        elif r["reference"] is not None and (r["verdict"] != PASS or kv_found):
            why = "; ".join(dict.fromkeys(r["reasons"])) or (
                NO_REASON if r["verdict"] != PASS else "tokens as cache-off"
            )
            lines.append(f"  {r['case']} {r['prompt']} (trial {r['trial']}): {r['verdict']}: {why}{kv_text(r)}")
    lines += [f"  {reason}" for reason in report["reasons"]]
    return lines


def kv_text(request: dict) -> str:
    """'; KV FOREIGN: slots 0–11 hold probe-a's blocks 0–11' for an audited request ('' when not audited)."""
    kv = request.get("kv_audit")
    if not kv:
        return ""
    return f"; KV {kv['verdict']}" + (f": {kv['shape'] or kv['reason']}" if kv.get("shape") or kv.get("reason") else "")
