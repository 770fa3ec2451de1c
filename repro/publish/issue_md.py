"""Issue Markdown: a report as GitHub-flavoured Markdown to paste into an upstream issue."""

from __future__ import annotations

import re
import shlex
import sys

from repro.atomic import write_bytes_atomic
from repro.commands import ArgumentParser
from repro.display import (
    DIVERGENCE_LEGEND,
    REPLAY_LEGEND,
    acceptance_label,
    arm_copy_paths,
    arm_kv_text,
    arm_title,
    arm_verdict_text,
    baseline_token_ids,
    blamed_chunks,
    blocks_text,
    cached_cell,
    commit_label,
    conditions_pairs,
    conditions_warning,
    confirmation_reason,
    confirmation_text,
    copy_path_text,
    day,
    diff_class_cell,
    gpu_text,
    has_arm_conditions,
    kv_audit_state,
    kv_cell,
    margin_class,
    number,
    probe_marks_text,
    rate_cell,
    replay_texts,
    run_probe_text,
    sharing_overlaps,
    sharing_text,
    sharing_window,
    span_text,
    trial_rate_text,
    trial_rates,
)
from repro.errors import EXIT_OK
from repro.report import CLAIM_LINE, load_report
from repro.verdict import ERROR, NEAR_TIE, PASS

GITHUB_BODY_LIMIT = 65_536  # characters GitHub accepts in an issue or comment body
# Token lists are shortened step by step until the body fits; None shows them whole.
TOKEN_LIMITS = (None, 64, 16, 4, 0)
MAX_WARNINGS = 40
MAX_CELL = 200
TABLE_HEADER = ("arm", "probe", "tokens", "cached", "verdict", "first diffs")
KV_HEADER = ("KV",)  # the verdict table's extra column when the run audited KV
CHUNK_HEADER = ("arm", "probe", "reuse", "blocks (tokens)", "layers", "planes", "max rel error", "bytes equal")
MAX_CHUNK_ROWS = 60


def escape_cell(text: str) -> str:
    """A table cell on one line, with pipes escaped so they cannot open a new column."""
    text = " ".join(str(text).split()).replace("\\", "\\\\").replace("|", "\\|")
    return text if len(text) <= MAX_CELL else text[: MAX_CELL - 1] + "…"


TRIALS_HEADER = ("trials",)  # columns the verdict table gains when a report records trials / a re-run alone
ALONE_HEADER = ("re-run alone",)


def _has(report: dict, key: str) -> bool:
    return any(isinstance(a.get(key), dict) for a in report["arms"])


def _verdict_cell(arm: dict, probe: dict) -> str:
    """'FAIL', or 'FAIL (intermittent 3/5, contention-dependent)' where its conditions qualify it."""
    marks = probe_marks_text(arm, probe)
    return f"{probe['verdict']} ({marks})" if marks else str(probe["verdict"])


def _trials_cell(arm: dict, probe: dict) -> str:
    rate = next((r for r in trial_rates(arm) if r.get("probe") == probe["name"]), None)
    return f"{rate_cell(rate)} ({rate.get('class')})" if rate else "—"


def _alone_cell(arm: dict, probe: dict) -> str:
    conf = arm.get("confirmation")
    if not isinstance(conf, dict):
        return "—"
    run = conf.get("run") if isinstance(conf.get("run"), dict) else {}
    alone = next((p for p in run.get("probes") or [] if p.get("name") == probe["name"]), None)
    return run_probe_text(alone) if alone else str(conf.get("status"))


def table_rows(report: dict) -> list[tuple[str, ...]]:
    """One row per probe of every arm but a passing baseline (it is what the others are compared to);
    with the KV audit on, each row ends with the probe's KV verdict; then, where the report records
    them, the probe's trial rate and its verdict when re-run alone."""
    kv = bool(kv_audit_state(report))
    trials, alone = _has(report, "trials"), _has(report, "confirmation")
    block_size = (report.get("config") or {}).get("block_size")
    rows = []
    for arm in report["arms"]:
        if arm["mode"] == "baseline" and arm["verdict"] == PASS:
            continue
        for p in arm.get("probes", []):
            tokens = "" if p.get("prompt_tokens") is None else str(p["prompt_tokens"])
            row = (arm_title(arm), p["name"], tokens, cached_cell(p), _verdict_cell(arm, p), diff_class_cell(p))
            row += ((kv_cell(p, block_size),) if kv else ()) + ((_trials_cell(arm, p),) if trials else ())
            rows.append(row + ((_alone_cell(arm, p),) if alone else ()))
        if not arm.get("probes"):
            empty = ("—",) * (kv + trials + alone)
            rows.append((arm_title(arm), "—", "", "—", arm["verdict"], "") + empty)
    return rows


def markdown_table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(escape_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def format_table(report: dict) -> str:
    header = TABLE_HEADER + (KV_HEADER if kv_audit_state(report) else ())
    header += (TRIALS_HEADER if _has(report, "trials") else ()) + (ALONE_HEADER if _has(report, "confirmation") else ())
    return markdown_table(header, table_rows(report))


def chunk_rows(report: dict) -> list[tuple[str, ...]]:
    """One row per blamed chunk (a run of adjacent blocks with corrupt cells) of every audited reuse."""
    block_size = (report.get("config") or {}).get("block_size")
    rows = []
    for arm in report["arms"]:
        if arm["mode"] == "baseline":
            continue
        for p in arm.get("probes", []):
            reuse_no = 0
            for r in p.get("requests") or []:
                reuse_no += r.get("role") == "reuse"
                for c in blamed_chunks(r.get("kv_audit")):
                    rows.append(
                        (
                            arm_title(arm),
                            p["name"],
                            str(reuse_no),
                            blocks_text(c["blocks"], block_size),
                            span_text(c["layers"]),
                            "+".join(c["planes"]),
                            "not finite" if c["max_rel"] is None else number(c["max_rel"]),
                            _sources(c),
                        )
                    )
    return rows


def _sources(chunk: dict) -> str:
    """'zeros (3 of 128 cells)': what the chunk's corrupt cells' bytes equal, where the audit found it."""
    counts: dict[str, int] = {}
    for source in chunk["sources"]:
        counts[source] = counts.get(source, 0) + 1
    shown = [f"{s} ({n} of {chunk['cells']} cells)" for s, n in list(counts.items())[:3]]
    return ", ".join(shown) + (" …" if len(counts) > 3 else "") or "—"


def format_kv_audit(report: dict) -> str:
    """Each reuse arm's audit and floor, then every blamed chunk in one table."""
    if not kv_audit_state(report):
        return "KV audit: off for this run (token verdicts only)."
    lines = [
        (
            "Each reuse's KV blocks, per layer and K/V plane, against the KV the cache-disabled baseline computed "
            "for the same tokens: EXACT bit-identical, NUMERIC within the arm's floor (its own cold prefill against "
            "the baseline), CORRUPT beyond it."
        ),
        "",
    ]
    lines += [f"- **{arm_title(a)}**: {arm_kv_text(a)}" for a in report["arms"]]
    rows = chunk_rows(report)
    if not rows:
        return "\n".join([*lines, "", "No block was blamed."])
    table = markdown_table(CHUNK_HEADER, rows[:MAX_CHUNK_ROWS])
    more = (
        f"\n\n_… {len(rows) - MAX_CHUNK_ROWS} more blamed chunks in the report JSON._"
        if len(rows) > MAX_CHUNK_ROWS
        else ""
    )
    return "\n".join([*lines, "", "Blamed chunks (runs of adjacent blocks with a corrupt cell):", "", table]) + more


def format_verdicts(report: dict) -> str:
    """Each arm's verdict with its first reasons, and the acceptance result."""
    lines = [f"- acceptance.matched = {acceptance_label(report)} · {report.get('generations', '?')} generations"]
    for arm in report["arms"]:
        reasons = "; ".join(arm.get("reasons") or [])
        reasons = reasons if len(reasons) <= 400 else reasons[:399] + "…"
        lines.append(f"- **{arm_title(arm)}**: {arm_verdict_text(arm)}" + (f" — {reasons}" if reasons else ""))
        if arm.get("error"):
            lines.append(f"  - {ERROR} {arm['error'].get('kind')}: {str(arm['error'].get('detail'))[:300]}")
    for err in report.get("errors") or []:
        lines.append(f"- {ERROR} {err.get('arm')}: {err.get('kind')}: {str(err.get('detail'))[:300]}")
    return "\n".join(lines)


def has_conditions(report: dict) -> bool:
    """The report records what its verdicts were measured under (issue 18); older ones do not."""
    return bool(conditions_pairs(report)) or any(has_arm_conditions(a) for a in report["arms"])


def _arm_conditions(arm: dict) -> list[str]:
    """One arm's conditions: its device and who shared it, LMCache's copy path, its trials, its re-run alone."""
    device = " · ".join(t for t in (gpu_text(arm), sharing_text(arm), sharing_window(arm)) if t) or NOT_RECORDED
    overlaps = "; ".join(sharing_overlaps(arm))
    lines = [f"- **{arm_title(arm)}**: {device}" + (f" ({overlaps})" if overlaps else "")]
    for path in arm_copy_paths(arm):
        detail = f": {path['detail']}" if path.get("detail") else ""
        lines.append(f"  - copy path, {copy_path_text({'copy_paths': [path]})}{detail}")
    if trial_rate_text(arm):
        lines.append(f"  - trials: {trial_rate_text(arm)}")
    if confirmation_text(arm):
        reason = confirmation_reason(arm)
        lines.append(f"  - {confirmation_text(arm)}" + (f" ({reason})" if reason else ""))
    return lines


def format_conditions(report: dict) -> str:
    """What the verdicts were measured under: the run's trials, re-run alone, LMCache copy path and
    gpu-load, then each arm's GPU, sharing (with the overlaps), copy path per process, trials and re-run alone."""
    lines = [f"- **{name}**: {text}" for name, text in conditions_pairs(report)]
    for arm in report["arms"]:
        if has_arm_conditions(arm):
            lines += _arm_conditions(arm)
    return "\n".join(lines)


# --- What maintainers ask for (upstream-landscape.md §1d): each line says "not recorded" where the
# report lacks it, so that reports written before these facts were recorded still render.

NOT_RECORDED = "not recorded"
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


def _workers(arm: dict) -> list[dict] | None:
    workers = (arm.get("effective_config") or {}).get("workers")
    return [w for w in workers if isinstance(w, dict)] if isinstance(workers, list) else None


def _per_arm(report: dict, fact) -> str:
    """One fact of every arm that ran: 'X (every arm)' when they agree, else 'arm: X; …', 'not recorded'
    for an arm that lacks it (fact returns None)."""
    shown = [(arm_title(a), fact(a)) for a in report["arms"] if a.get("effective_config") is not None]
    values = {v for _, v in shown}
    if not shown or values == {None}:
        return NOT_RECORDED
    if len(values) == 1:
        return f"{values.pop()} (every arm)"
    return "; ".join(f"{title}: {NOT_RECORDED if v is None else v}" for title, v in shown)


def _worker_values(arm: dict, key: str) -> str | None:
    values = sorted({str(w[key]) for w in _workers(arm) or [] if w.get(key) is not None})
    return ", ".join(values) or None


def _attention_backend(arm: dict) -> str | None:
    names = sorted(
        {
            str(b.get("name"))
            for w in _workers(arm) or []
            for b in w.get("attention_backends") or []
            if isinstance(b, dict)
        }
    )
    return " + ".join(names) or None


def _capability(arm: dict) -> str | None:
    """The GPU's compute capability as the workers saw it; 'none (cpu)' where they ran on no GPU."""
    found = _worker_values(arm, "compute_capability")
    platforms = _worker_values(arm, "platform")
    return found or (f"none ({platforms})" if platforms and "cuda" not in platforms.split(", ") else None)


def _hashseeds(arm: dict) -> str | None:
    child = (arm.get("effective_config") or {}).get("pythonhashseed")
    workers = _worker_values(arm, "pythonhashseed")
    if child is None and workers is None:
        return None
    if workers is not None and {child} == set(workers.split(", ")):
        return f"{child} in the engine child and its workers"
    return f"engine child {NOT_RECORDED if child is None else child}, workers {workers or NOT_RECORDED}"


def _batch_invariant(arm: dict) -> str | None:
    state = (arm.get("effective_config") or {}).get("batch_invariant")
    if not isinstance(state, dict):
        return None
    why = "; ".join(state.get("reasons") or [])
    active = state.get("active")
    text = "active" if active is True else "**not active**" if active is False else "not confirmed"
    return text + (f" ({why})" if why and active is not True else "")


def _lmcache_arms(report: dict) -> list[dict]:
    return [a for a in report["arms"] if "lmcache" in str((a.get("connector") or {}).get("name", "")).lower()]


def _lmcache_wheel(report: dict) -> str:
    arms = _lmcache_arms(report)
    if not arms:
        return "no LMCache arm in this report"
    build = next((a["versions"]["lmcache_build"] for a in arms if (a.get("versions") or {}).get("lmcache_build")), None)
    engine_torch = (report["provenance"].get("engine_versions") or {}).get("torch")
    logged = sorted({str(a["lmcache"]["cuda_ops"]) for a in arms if (a.get("lmcache") or {}).get("cuda_ops")})
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


def _lmcache_config(report: dict) -> list[str]:
    given = report["provenance"].get("lmcache_config")
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
        logged = (arm.get("lmcache") or {}).get("effective_config")
        if logged:
            shown = _lmcache_settings(logged).replace("`", "'")
            lines.append(f"  - as LMCache logged it ({arm_title(arm)}): `{shown}`")
    return lines


def _arm_line(arm: dict) -> str:
    return f"**{arm_title(arm)}**: {arm_verdict_text(arm)} · {arm_kv_text(arm)}"


def _is_mp(arm: dict) -> bool:
    target = str((arm.get("effective_config") or {}).get("kv_audit_target") or "")
    return (arm.get("connector") or {}).get("name") == MP_CONNECTOR or target.rpartition(":")[2] == MP_CONNECTOR


def _batch_invariant_lines(report: dict) -> list[str]:
    requested = (report.get("config") or {}).get("batch_invariant")
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


def format_maintainer_facts(report: dict) -> str:
    """What maintainers ask for before they look at a KV-reuse report: the attention backend, the GPU's
    compute capability, the LMCache wheel's build and whether its compiled ops loaded, PYTHONHASHSEED
    of every process, the LMCache config, and the controls (shape-matched native, batch-invariant
    kernels, LMCache's multi-process connector)."""
    prov = report["provenance"]
    gpus = ", ".join((prov.get("engine_versions") or {}).get("gpus") or [])
    seed = prov.get("pythonhashseed")
    matched = [a for a in report["arms"] if a.get("matched_to")]
    mp = [a for a in report["arms"] if _is_mp(a)]
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


def format_tokens(ids: list[int] | None, limit: int | None) -> str:
    if ids is None:
        return "(not recorded)"
    if limit is not None and len(ids) > limit:
        return f"`{' '.join(map(str, ids[:limit]))}` … ({len(ids) - limit} more, truncated to fit; full list in the report JSON)"
    return f"`{' '.join(map(str, ids))}`"


def _margin_text(m: dict | None) -> str:
    if not m:
        return "margin: not recorded"
    fmt = lambda x: "n/a" if x is None else f"{x:.3f}"
    base = (
        f"baseline margin {fmt(m.get('baseline_margin'))}"
        if m.get("baseline_margin") is not None
        else f"baseline gap ≥ {fmt(m.get('baseline_gap_lower_bound'))} (reuse token outside its top-k)"
    )
    cls = margin_class(m)
    tie = f" · **{cls}**" if cls == NEAR_TIE else f" · {cls}"
    return (
        f"baseline token {m.get('baseline_token')} vs reuse token {m.get('reuse_token')}; {base} nats, "
        f"reuse margin {fmt(m.get('reuse_margin'))} nats, baseline top-1/top-2 gap {fmt(m.get('baseline_top_gap'))}{tie}"
    )


def format_diffs(report: dict, token_limit: int | None) -> str:
    """Every reuse that differed: where, the logprob margins on both sides, both token lists, and
    whose answer it replays (repro.replays) where the report says."""
    lines, replayed = [], False
    for arm in report["arms"]:
        for p in arm.get("probes", []):
            for i, r in enumerate(p.get("requests") or []):
                if r.get("first_diff") is None:
                    continue
                lines.append(
                    f"- **{arm_title(arm)}** / `{p['name']}` / {r.get('role', 'request')} {i}: "
                    f"{r.get('cached_tokens')} cached tokens, first diff @{r['first_diff']}; {_margin_text(r.get('margin'))}"
                )
                replays = [f"  - **{text}**" for text in replay_texts(r)]
                replayed = replayed or bool(replays)
                lines += replays
                if token_limit != 0:
                    lines.append(f"  - baseline: {format_tokens(baseline_token_ids(report, p['name']), token_limit)}")
                    lines.append(f"  - reuse: {format_tokens(r.get('token_ids'), token_limit)}")
    if not lines:
        return "No reuse differed from the baseline."
    if replayed:
        lines.append(f"\n_Replays: {REPLAY_LEGEND}._")
    if token_limit == 0:
        lines.append("\n_Generated token lists left out to fit GitHub's size limit; they are in the report JSON._")
    return "\n".join(lines)


def lmcache_signals(arm: dict) -> list[str]:
    """LMCache's own counters on an arm (double unpins first), as 'name: value' lines."""
    signals = arm.get("lmcache") or {}
    keys = sorted(signals, key=lambda k: ("unpin" not in k, k))
    return [f"{k}: {signals[k]}" for k in keys if isinstance(signals[k], (int, float, str, bool))]


def format_warnings(report: dict) -> str:
    """LMCache signals and findings per arm, then log warnings grouped by message across arms."""
    lines = []
    for arm in report["arms"]:
        lines += [f"- {arm_title(arm)} · LMCache {signal}" for signal in lmcache_signals(arm)]
        lines += [f"- {arm_title(arm)} · {note}" for note in arm.get("findings") or []]
    by_message: dict[str, list[str]] = {}
    for w in report.get("warnings") or []:
        msg = " ".join(str(w.get("message", "")).split())[:300].replace("`", "'")
        by_message.setdefault(msg, []).append(f"{w.get('arm')} ×{w.get('count')}")
    for msg, where in list(by_message.items())[:MAX_WARNINGS]:
        lines.append(f"- `{msg}` ({', '.join(where)})")
    if len(by_message) > MAX_WARNINGS:
        lines.append(f"- … {len(by_message) - MAX_WARNINGS} more distinct warnings in the report JSON")
    return "\n".join(lines) if lines else "None recorded."


def format_stack(report: dict) -> str:
    prov = report["provenance"]
    kit = prov.get("kit") or {}
    hw = prov.get("hardware") or {}
    pkgs = ", ".join(f"{k} {v}" for k, v in sorted((prov.get("packages") or {}).items()))
    engine = ", ".join(f"{k} {v}" for k, v in sorted((prov.get("engine_versions") or {}).items()))
    hw_txt = ", ".join(
        f"{k} {', '.join(map(str, v)) or 'none' if isinstance(v, list) else v}" for k, v in sorted(hw.items())
    )
    return "\n".join(
        [
            f"- packages (parent process): {pkgs or 'not recorded'}",
            f"- engine process: {engine or 'not recorded'}",
            f"- Python {prov.get('python', '?')} on {prov.get('platform', '?')}",
            f"- hardware: **{report.get('hardware_label', '?')}** ({hw_txt or 'not recorded'})",
            f"- kvkit {report.get('tool_version', '?')}, commit {kit.get('commit', '?')}"
            + (" (dirty)" if kit.get("dirty") else ""),
        ]
    )


def format_reproduce(report: dict) -> str:
    argv = report["provenance"].get("argv") or []
    return (
        "```sh\npython -m repro.verify_kv_reuse " + shlex.join(map(str, argv)) + "\n```\n\n"
        "With the attached kvkit archive, `make repro` sets up the pinned environment and runs the reference "
        "command for this machine (`PROFILE=cpu` for the CPU self-test); `README.md` in it says more."
    )


def format_conditions_warning(report: dict) -> list[str]:
    """Above the table, where a failure it shows was intermittent or needed the shared device; else nothing."""
    warning = conditions_warning(report)
    return [f"**Read the verdicts with their conditions:** {warning}."] if warning else []


def render_body(report: dict, token_limit: int | None) -> str:
    commit = commit_label(report["provenance"])
    parts = [
        f"### KV-cache reuse verification: {report.get('hardware_label', '?')} · kvkit {commit} · {day(report)}",
        (
            "Generated token IDs of each reuse are compared exactly with a no-reuse baseline run in a separate "
            "process (greedy decoding, `ignore_eos`). `0→1280×3`: the cold request reported 0 cached tokens, each "
            f"of 3 reuses 1280; `@4,15`: first differing token index; {DIVERGENCE_LEGEND}."
        ),
        *format_conditions_warning(report),
        format_table(report),
        format_verdicts(report),
        *(["#### Conditions\n\n" + format_conditions(report)] if has_conditions(report) else []),
        *(["#### KV audit\n\n" + format_kv_audit(report)] if kv_audit_state(report) is not None else []),
        "#### What maintainers ask for\n\n" + format_maintainer_facts(report),
        "#### First diffs and margins\n\n" + format_diffs(report, token_limit),
        "#### Stack\n\n" + format_stack(report),
        "#### Reproduce\n\n" + format_reproduce(report),
        "#### Warnings\n\n" + format_warnings(report),
        f"`{CLAIM_LINE}`",
    ]
    return "\n\n".join(parts) + "\n"


def hard_truncate(body: str, limit: int) -> str:
    """Cut at a line boundary, close an open code fence, say so, and keep the claim line last."""
    tail = f"\n\n_… truncated to fit GitHub's {GITHUB_BODY_LIMIT}-character limit; the full report is in the kit._\n\n`{CLAIM_LINE}`\n"
    kept = body[: max(0, limit - len(tail) - 8)]
    kept = kept[: kept.rfind("\n")] if "\n" in kept else kept
    if kept.count("```") % 2:
        kept += "\n```"
    return kept + tail


def format_issue_md(report: dict, limit: int = GITHUB_BODY_LIMIT) -> str:
    """The issue body; token lists shrink first, then the body is cut, so it always fits in limit."""
    for token_limit in TOKEN_LIMITS:
        body = render_body(report, token_limit)
        if len(body) <= limit:
            return body
    return hard_truncate(body, limit)


def main(argv: list[str]) -> int:
    """`python -m repro issue-md REPORT [--out FILE]`: print the issue body, or write it to FILE."""
    parser = ArgumentParser(prog="python -m repro issue-md", description=main.__doc__)
    parser.add_argument("report", help="a kvkit report JSON")
    parser.add_argument("--out", help="write the Markdown to this file instead of stdout")
    args = parser.parse_args(argv)
    body = format_issue_md(load_report(args.report))
    if args.out:
        write_bytes_atomic(args.out, body.encode("utf-8"))
        print(f"wrote {args.out} ({len(body)} characters)", file=sys.stderr)
    else:
        sys.stdout.write(body)
    return EXIT_OK
