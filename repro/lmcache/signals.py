"""LMCache's own signals in an arm log, cross-checked against vLLM's per-request counters.

What LMCache says is evidence beside the verdict, not the verdict itself: vLLM's cached-token
count decides hit or miss; LMCache's per-request count (`kv_transfer_params`), its "Retrieved N
out of M" lines and its warnings are recorded, and every disagreement is reported. One finding
changes the verdict: a start in degraded mode (LMCache caught its own start-up failure and
silently recomputes) makes the arm ERROR, never PASS; repro.judge.verdict decides that, this module
only reports what the log says.

The retrieve, store and lookup lines, and the per-request count, are written by the in-process
connector (LMCacheConnectorV1) inside the arm's own engine. An LMCacheMPConnector arm moves its KV
in the LMCache MP server the kit starts (repro.lmcache.mp), which logs to a file of its own: the
arm's log holds none of those lines, so their absence says nothing about that arm and the checks
built on them are left out, with one note naming the server's log. What the arm's log can still
say is kept: degraded mode (the MP connector logs it when the server stops answering), the
compiled-ops warning of the engine's own LMCache import, double unpins.

Each LMCache process of an arm (the engine, and an MP arm's server) runs LMCache's compiled ops or
its torch fallback, each decided at its own `import lmcache` (repro.lmcache.ops): `copy_paths` says
which for each, from the fallback warning in its log and the import its process (or a probe in its
env) made; never "unknown": a process with no evidence is "not recorded" with the reason.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from repro.judge.logscan import clean_line
from repro.lmcache.mp import CONNECTOR as MP_CONNECTOR
from repro.lmcache.ops import FALLBACK_WARNING, OPS_MODULE

# Start-up failure caught by LMCacheManager, or its health monitor giving up on a backend: either
# way LMCache recomputes everything while vLLM reports a healthy engine.
DEGRADED = re.compile(r"(?:operate in|entering) degraded mode")
DOUBLE_UNPIN = re.compile(r"Pin count of MemoryObj \S*\s*is negative: (-?\d+)\.?\s*Double unpin occurred somewhere")
RETRIEVED = re.compile(
    r"\[req_id=(?P<req>[^\]]+)\] Retrieved (?P<got>\d+) out of (?P<need>\d+) (?:required tokens \(from (?P<total>\d+) total tokens\)|out of total (?P<total2>\d+) tokens)"
)
STORED = re.compile(r"\[req_id=(?P<req>[^\]]+)\] Stored (?P<stored>\d+) out of total (?P<total>\d+) tokens")
LOOKUP = re.compile(
    r"Reqid: (?P<req>\S+), Total tokens (?P<total>\d+), Inference Engine computed tokens: (?P<computed>\d+), LMCache hit tokens: (?P<hit>\d+), (?:but )?need to load: (?P<load>\d+)"
)
CONFIG = re.compile(
    r"(?:LMCache Configuration|Creating LMCacheEngine with config): (?P<cfg>.*?)(?:\s+\([\w./-]+:\d+:[\w.]+\))?$"
)
INITIALIZED = re.compile(r"LMCache initialized for role (?P<role>\S+) with version (?P<version>[^,]+)")
MAX_CONFIG_CHARS = 4000


def scan_log(text: str) -> dict:
    """Everything LMCache said that the report needs, from one arm's log."""
    out: dict = {
        "degraded": [],
        "double_unpin_warnings": 0,
        "retrieves": [],
        "stores": [],
        "lookups": [],
        "config": None,
        "versions": [],
    }
    for raw in text.splitlines():
        line = clean_line(raw)
        if DEGRADED.search(line):
            out["degraded"].append(line[:500])
        if DOUBLE_UNPIN.search(line):
            out["double_unpin_warnings"] += 1
        if m := RETRIEVED.search(line):
            out["retrieves"].append(
                {
                    "req_id": m["req"],
                    "retrieved": int(m["got"]),
                    "required": int(m["need"]),
                    "total": int(m["total"] or m["total2"]),
                }
            )
        if m := STORED.search(line):
            out["stores"].append({"req_id": m["req"], "stored": int(m["stored"]), "total": int(m["total"])})
        if m := LOOKUP.search(line):
            out["lookups"].append(
                {
                    "req_id": m["req"],
                    "total": int(m["total"]),
                    "computed": int(m["computed"]),
                    "hit": int(m["hit"]),
                    "need_to_load": int(m["load"]),
                }
            )
        if (m := CONFIG.search(line)) and out["config"] is None:
            out["config"] = m["cfg"][:MAX_CONFIG_CHARS]
        if m := INITIALIZED.search(line):
            out.setdefault("initialized", []).append(line[line.index("LMCache initialized") :][:600])
            if m["version"] not in out["versions"]:
                out["versions"].append(m["version"].strip())
    return out


ENGINE, SERVER = "engine", "MP server"


def _engine_copy_path(build: dict | None, fallback_lines: list[str]) -> dict:
    """The engine's: LMCache's own warning in the arm's log decides fallback; else what the child's
    import of lmcache.cuda_ops said (repro.engine.facts.lmcache_build, or its older `cuda_ops` text)."""
    build = build or {}
    error = build.get("ops_import_error")
    if not error and str(build.get("cuda_ops", "")).startswith("not loaded: "):
        error = build["cuda_ops"][len("not loaded: ") :]
    said = (
        build.get("copy_path") or {"loaded": "compiled"}.get(build.get("cuda_ops")) or ("fallback" if error else None)
    )
    if fallback_lines:
        detail = f"{OPS_MODULE}: {error}" if error else f"LMCache logged: {fallback_lines[0][:300]}"
        if said == "compiled":
            detail += " (though the child's own import of lmcache.cuda_ops worked)"
        return {"process": ENGINE, "path": "fallback", "source": None, "detail": detail}
    if said == "compiled":
        source = build.get("ops_source") or "wheel"  # the child before kit builds tried the wheel only
        where = build.get("ops_build_dir") or build.get("cuda_ops_file") or "lmcache.cuda_ops imported"
        return {"process": ENGINE, "path": "compiled", "source": source, "detail": where}
    if said == "fallback":
        return {"process": ENGINE, "path": "fallback", "source": None, "detail": f"{OPS_MODULE}: {error}"}
    why = build.get("problem") or "the arm recorded no LMCache build"
    return {
        "process": ENGINE,
        "path": "not recorded",
        "source": None,
        "detail": f"{why}; no fallback warning in its log",
    }


def copy_paths(engine_build: dict | None, engine_log: str, server: dict | None) -> list[dict]:
    """Each LMCache process's copy path: [{"process": "engine" | "MP server", "path": "compiled" |
    "fallback" | "not recorded", "source": "wheel" | "kit build" | None, "detail": str}].

    `engine_build`: the arm's versions["lmcache_build"]; `engine_log`: the arm's log; `server`: an MP
    arm's server copy path (repro.lmcache.mp.MPServer.copy_path), None for an arm without a server."""
    warned = [x[x.index(FALLBACK_WARNING) :] for x in map(clean_line, engine_log.splitlines()) if FALLBACK_WARNING in x]
    out = [_engine_copy_path(engine_build, warned)]
    if server is not None:
        out.append(
            {
                "process": SERVER,
                "path": server.get("path") or "not recorded",
                "source": server.get("source"),
                "detail": server.get("detail") or "the kit recorded nothing about it",
            }
        )
    return out


def arm_copy_paths(
    connector: str | None, engine_build: dict | None, engine_log: str, server: dict | None
) -> list[dict]:
    """copy_paths for an arm of this connector: an LMCacheMPConnector arm without its server's path has that
    server "not recorded"; an in-process arm has no server."""
    if connector == MP_CONNECTOR and server is None:
        server = {"path": "not recorded", "detail": "the kit passed no copy path for its MP server"}
    return copy_paths(engine_build, engine_log, server if connector == MP_CONNECTOR else None)


def copy_path_finding(paths: list[dict]) -> str:
    """The finding's text: engine compiled (wheel); MP server fallback (lmcache.cuda_ops: ImportError: ...)."""
    parts = []
    for p in paths:
        why = p["detail"]
        if p["path"] == "compiled":
            why = f"kit build {p['detail']}" if p["source"] == "kit build" else str(p["source"])
        parts.append(f"{p['process']} {p['path']} ({why})")
    return "; ".join(parts)


def cuda_ops_text(engine: dict) -> str:
    """The old `cuda_ops` signal (read by older readers and the issue text), from the engine's copy path."""
    if engine["path"] == "fallback":
        logged = engine["detail"].startswith("LMCache logged")
        return "not loaded: fell back to torch ops" if logged else f"not loaded: {engine['detail']}"
    if engine["path"] == "compiled":
        return f"loaded: {engine['source']}"
    return f"not recorded: {engine['detail']}"


def _for_request(items: list[dict], request_id: str | None) -> list[dict]:
    if request_id is None:
        return []
    return [i for i in items if i["req_id"] == request_id or i["req_id"].startswith(f"{request_id}-")]


def cross_check(
    probes: list[dict], scan: dict, in_process: bool = True
) -> tuple[dict[tuple[str, int], dict], list[str]]:
    """LMCache's view of each request ({(probe, index): view}) and where it disagrees with vLLM's.

    `in_process` False (an LMCacheMPConnector arm): the arm's log has no retrieve or lookup lines
    and the connector reports no per-request count, so nothing is read from the log and only a
    per-request count that is there is compared."""
    views: dict[tuple[str, int], dict] = {}
    findings = []
    for probe in probes:
        for i, req in enumerate(probe.get("requests", [])):
            ktp = req.get("kv_transfer_params") or {}
            reported = ktp.get("num_lmcache_cached_tokens")
            retrieves = _for_request(scan["retrieves"], req.get("request_id")) if in_process else []
            lookups = _for_request(scan["lookups"], req.get("request_id")) if in_process else []
            view = {
                "reported_hit_tokens": reported,
                "retrieved": sum(r["retrieved"] for r in retrieves) if retrieves else None,
                "required": sum(r["required"] for r in retrieves) if retrieves else None,
                "lookup_hit_tokens": lookups[-1]["hit"] if lookups else None,
            }
            views[(probe["name"], i)] = view
            where = f"{probe['name']} {req['role']} {i}"
            vllm_cached = req.get("cached_tokens")
            if in_process and reported is None and req["role"] == "reuse":
                findings.append(f"{where}: LMCache reported no per-request hit count")
            if view["retrieved"] is not None and view["retrieved"] < view["required"]:
                findings.append(f"{where}: LMCache retrieved {view['retrieved']} of {view['required']} required tokens")
            if view["retrieved"] is not None and vllm_cached is not None and view["retrieved"] != vllm_cached:
                findings.append(
                    f"{where}: LMCache retrieved {view['retrieved']} tokens where vLLM counted {vllm_cached} cached"
                )
            if in_process and vllm_cached and view["retrieved"] is None and req["role"] == "reuse":
                findings.append(f"{where}: vLLM counted {vllm_cached} cached tokens but no LMCache retrieve was logged")
            if reported is not None and vllm_cached is not None and reported not in (vllm_cached, vllm_cached + 1):
                findings.append(f"{where}: LMCache reports {reported} hit tokens, vLLM {vllm_cached} cached")
    return views, findings


@dataclass(frozen=True)
class LMCacheEvidence:
    """What LMCache's log says about one arm; the caller records it (repro.judge.verdict decides on `degraded`)."""

    signals: dict  # the arm's `lmcache` record
    request_views: dict  # {(probe name, request index): LMCache's view of that request}
    findings: tuple[str, ...]
    degraded: tuple[str, ...]  # degraded-mode log lines (at most 3): LMCache silently recomputes


def lmcache_evidence(
    probes: list[dict],
    log_text: str,
    connector: str | None = None,
    server_log: str | None = None,
    engine_build: dict | None = None,
    server_copy_path: dict | None = None,
) -> LMCacheEvidence:
    """Scan an LMCache arm's log and cross-check it with the arm's judged probes (nothing is modified).

    `connector`: the arm's connector name; LMCacheMPConnector leaves out the checks that read the
    in-process connector's lines (module docstring), anything else (or None) is read as the
    in-process connector. `server_log`: where the MP server's log is, as the report names it.
    `engine_build`, `server_copy_path`: see copy_paths (an MP arm without the latter has its server
    "not recorded")."""
    in_process = connector != MP_CONNECTOR
    scan = scan_log(log_text)
    retrieves = len(scan["retrieves"])
    paths = arm_copy_paths(connector, engine_build, log_text, server_copy_path)
    signals = {
        "degraded_mode": bool(scan["degraded"]),
        "degraded_messages": scan["degraded"][:3],
        "copy_paths": paths,
        "cuda_ops": cuda_ops_text(paths[0]),
        "double_unpin_warnings": scan["double_unpin_warnings"],
        "retrieves": retrieves,
        "double_unpin_per_retrieve": round(scan["double_unpin_warnings"] / retrieves, 3) if retrieves else None,
        "stores": len(scan["stores"]),
        "effective_config": scan["config"] or "unavailable: LMCache logged no configuration line",
        "initialized": scan.get("initialized", [])[:2],
        "versions_logged": scan["versions"],
    }
    if not in_process:  # the counts above are of lines this arm's log never has
        signals.update(retrieves=None, double_unpin_per_retrieve=None, stores=None)
    views, findings = cross_check(probes, scan, in_process)
    if not in_process:
        where = f"its log ({server_log})" if server_log else "its own log, beside this arm's"
        findings.append(
            f"{MP_CONNECTOR}: LMCache's retrieves and stores for this arm happen in the LMCache MP server "
            f"and are logged in {where}; they are not cross-checked against vLLM's cached-token counts"
        )
    if scan["double_unpin_warnings"]:
        over = f"over {retrieves} retrieves" if in_process else "in this arm's log"
        findings.append(
            f"{scan['double_unpin_warnings']} 'Double unpin' warnings {over} (LMCache #5090; recorded, not a verdict)"
        )
    findings.append(f"LMCache copy path: {copy_path_finding(paths)}")
    return LMCacheEvidence(signals, views, tuple(findings), tuple(scan["degraded"][:3]))
