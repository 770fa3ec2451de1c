"""The issue Markdown's sections on what the run ran under: its conditions (the run's trials, re-run alone,
copy path and load neighbours, then each arm's device, sharing, trials and re-run alone) and what maintainers
ask for (attention backend, compute capability, the LMCache wheel and config, PYTHONHASHSEED, the controls).
"""

from __future__ import annotations

import re

from repro.judge.wording import NOT_RECORDED
from repro.readmodel import Arm, Report


def _arm_conditions(arm: Arm) -> list[str]:
    """One arm's conditions: its device and who shared it, LMCache's copy path, its trials, its re-run alone."""
    c = arm.conditions
    device = " · ".join(t for t in (c.gpu_text, c.sharing_text, c.sharing_window) if t) or NOT_RECORDED
    overlaps = "; ".join(c.sharing_overlaps)
    lines = [f"- **{arm.title}**: {device}" + (f" ({overlaps})" if overlaps else "")]
    for path in c.copy_paths:
        detail = f": {path.detail}" if path.detail else ""
        lines.append(f"  - copy path, {path.text}{detail}")
    if c.trial_rate_text:
        lines.append(f"  - trials: {c.trial_rate_text}")
    if c.confirmation_text:
        reason = c.confirmation_reason
        lines.append(f"  - {c.confirmation_text}" + (f" ({reason})" if reason else ""))
    return lines


def format_conditions(report: Report) -> str:
    """What the verdicts were measured under: the run's trials, re-run alone, LMCache copy path and
    gpu-load or cpu-load, then each arm's GPU, sharing (with the overlaps), copy path per process, trials and
    re-run alone."""
    lines = [f"- **{name}**: {text}" for name, text in report.run_conditions.pairs]
    for arm in report.arms:
        if arm.conditions.recorded:
            lines += _arm_conditions(arm)
    return "\n".join(lines)


# --- What maintainers ask for (upstream-landscape.md §1d): each line says "not recorded" where the
# report lacks it, so that reports written before these facts were recorded still render.

MP_CONNECTOR = "LMCacheMPConnector"
# LMCache settings a maintainer asks about first; the whole logged configuration is in the report JSON.
LMCACHE_KEYS = (
    "chunk_size",
    "local_cpu",
    "max_local_cpu_size",
    "local_disk",
    "remote_url",
    "use_layerwise",
    "save_unfull_chunk",
    "save_decode_cache",
    "enable_blending",
    "use_gpu_connector_v3",
)
MAX_FACT_CHARS = 600


def _workers(arm: Arm) -> list[dict] | None:
    workers = (arm.effective_config or {}).get("workers")
    return [w for w in workers if isinstance(w, dict)] if isinstance(workers, list) else None


def _per_arm(report: Report, fact) -> str:
    """One fact of every arm that ran: 'X (every arm)' when they agree, else 'arm: X; …', 'not recorded'
    for an arm that lacks it (fact returns None)."""
    shown = [(a.title, fact(a)) for a in report.arms if a.effective_config is not None]
    values = {v for _, v in shown}
    if not shown or values == {None}:
        return NOT_RECORDED
    if len(values) == 1:
        return f"{values.pop()} (every arm)"
    return "; ".join(f"{title}: {NOT_RECORDED if v is None else v}" for title, v in shown)


def _worker_values(arm: Arm, key: str) -> str | None:
    values = sorted({str(w[key]) for w in _workers(arm) or [] if w.get(key) is not None})
    return ", ".join(values) or None


def _attention_backend(arm: Arm) -> str | None:
    names = sorted(
        {
            str(b.get("name"))
            for w in _workers(arm) or []
            for b in w.get("attention_backends") or []
            if isinstance(b, dict)
        }
    )
    return " + ".join(names) or None


def _capability(arm: Arm) -> str | None:
    """The GPU's compute capability as the workers saw it; 'none (cpu)' where they ran on no GPU."""
    found = _worker_values(arm, "compute_capability")
    platforms = _worker_values(arm, "platform")
    return found or (f"none ({platforms})" if platforms and "cuda" not in platforms.split(", ") else None)


def _hashseeds(arm: Arm) -> str | None:
    child = (arm.effective_config or {}).get("pythonhashseed")
    workers = _worker_values(arm, "pythonhashseed")
    if child is None and workers is None:
        return None
    if workers is not None and {child} == set(workers.split(", ")):
        return f"{child} in the engine child and its workers"
    return f"engine child {NOT_RECORDED if child is None else child}, workers {workers or NOT_RECORDED}"


def _batch_invariant(arm: Arm) -> str | None:
    state = (arm.effective_config or {}).get("batch_invariant")
    if not isinstance(state, dict):
        return None
    why = "; ".join(state.get("reasons") or [])
    active = state.get("active")
    text = "active" if active is True else "**not active**" if active is False else "not confirmed"
    return text + (f" ({why})" if why and active is not True else "")


def _lmcache_arms(report: Report) -> list[Arm]:
    return [a for a in report.arms if "lmcache" in str(a.connector_name or "").lower()]


def _lmcache_wheel(report: Report) -> str:
    arms = _lmcache_arms(report)
    if not arms:
        return "no LMCache arm in this report"
    build = next((a.versions["lmcache_build"] for a in arms if a.versions.get("lmcache_build")), None)
    engine_torch = (report.provenance.get("engine_versions") or {}).get("torch")
    logged = sorted({str(a.lmcache["cuda_ops"]) for a in arms if a.lmcache.get("cuda_ops")})
    log_text = f"LMCache's log: {', '.join(logged)}" if logged else f"LMCache's log: {NOT_RECORDED}"
    if not isinstance(build, dict):
        return f"build {NOT_RECORDED} · {log_text}"
    cuda = ", ".join(build.get("cuda_runtime") or []) or NOT_RECORDED
    nvcc = f", nvcc {build['nvcc']}" if build.get("nvcc") else ""
    torch = build.get("torch_build") or NOT_RECORDED
    return (
        f"{build.get('version') or '?'} · CUDA build: {cuda}{nvcc} · torch build: {torch}"
        + (f" (the engine ran torch {engine_torch})" if engine_torch else "")
        + f" · compiled ops: {build.get('cuda_ops') or build.get('problem') or NOT_RECORDED} · {log_text}"
    )


def _lmcache_settings(text: object) -> str:
    """The settings maintainers ask about first, read from the configuration line LMCache logged (a
    dict's repr, cut at the report's limit); the line itself where none of them is in it."""
    line = " ".join(str(text).split())
    picked = []
    for key in LMCACHE_KEYS:
        if m := re.search(rf"['\"]?\b{key}['\"]?\s*[:=]\s*([^,}}]+)", line):
            picked.append(f"{key} {m.group(1).strip()}")
    if not picked:
        return line[:MAX_FACT_CHARS]
    return ", ".join(picked) + " (the whole line is in the report JSON)"


def _lmcache_config(report: Report) -> list[str]:
    given = report.provenance.get("lmcache_config")
    if isinstance(given, dict):
        head = f"`{given.get('path')}` (sha256 {str(given.get('sha256'))[:12]}…)"
        contents = given.get("contents")
        head += "" if contents else "; its contents are not recorded in the report"
    else:
        head = "none given (`--lmcache-config`)" if _lmcache_arms(report) else "no LMCache arm in this report"
    lines = [f"- **LMCache config**: {head}"]
    if isinstance(given, dict) and given.get("contents"):
        lines.append("  ```yaml\n" + "\n".join("  " + ln for ln in str(given["contents"]).splitlines()) + "\n  ```")
    for arm in _lmcache_arms(report):
        logged = arm.lmcache.get("effective_config")
        if logged:
            shown = _lmcache_settings(logged).replace("`", "'")
            lines.append(f"  - as LMCache logged it ({arm.title}): `{shown}`")
    return lines


def _arm_line(arm: Arm) -> str:
    return f"**{arm.title}**: {arm.verdict_text} · {arm.kv_text}"


def _is_mp(arm: Arm) -> bool:
    target = str((arm.effective_config or {}).get("kv_audit_target") or "")
    return arm.connector_name == MP_CONNECTOR or target.rpartition(":")[2] == MP_CONNECTOR


def _batch_invariant_lines(report: Report) -> list[str]:
    requested = report.config.get("batch_invariant")
    if requested is None:
        return [f"- **Batch-invariant kernels**: {NOT_RECORDED} (the report predates `--batch-invariant`)"]
    if not requested:
        return [
            (
                "- **Batch-invariant kernels**: off for this run (`--batch-invariant` runs every arm with "
                "`VLLM_BATCH_INVARIANT=1` on a CUDA GPU of compute capability 8.0 or higher)"
            )
        ]
    return [f"- **Batch-invariant kernels** (`--batch-invariant`): {_per_arm(report, _batch_invariant)}"]


def format_maintainer_facts(report: Report) -> str:
    """What maintainers ask for before they look at a KV-reuse report: the attention backend, the GPU's
    compute capability, the LMCache wheel's build and whether its compiled ops loaded, PYTHONHASHSEED
    of every process, the LMCache config, and the controls (shape-matched native, batch-invariant
    kernels, LMCache's multi-process connector)."""
    prov = report.provenance
    gpus = ", ".join((prov.get("engine_versions") or {}).get("gpus") or [])
    seed = prov.get("pythonhashseed")
    matched = [a for a in report.arms if a.matched_to]
    mp = [a for a in report.arms if _is_mp(a)]
    lines = [
        f"- **Attention backend**: {_per_arm(report, _attention_backend)}",
        f"- **GPU compute capability**: {_per_arm(report, _capability)}" + (f" ({gpus})" if gpus else ""),
        f"- **LMCache wheel**: {_lmcache_wheel(report)}",
        (
            f"- **PYTHONHASHSEED**: set to {seed if seed is not None else NOT_RECORDED} for every engine process; "
            f"as they saw it: {_per_arm(report, _hashseeds)}"
        ),
        *_lmcache_config(report),
        *(
            [f"- **Shape-matched native**: {_arm_line(a)}" for a in matched]
            or [f"- **Shape-matched native**: {NOT_RECORDED} (no `native-matched` arm in this report)"]
        ),
        *_batch_invariant_lines(report),
        *(
            [
                f"- **LMCache multi-process connector**: {_arm_line(a)} (LMCache's multi-process path, "
                "which upstream says LMCache #4463 does not affect)"
                for a in mp
            ]
            or [f"- **LMCache multi-process connector**: {NOT_RECORDED} (no `{MP_CONNECTOR}` arm in this report)"]
        ),
    ]
    return "\n".join(lines)
