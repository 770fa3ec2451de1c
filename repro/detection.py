"""Detection power: planted faults x positions x windows, no-fault controls, the matrix and its page.

`python -m repro detection` runs the real CPU engine, one engine (arm) per fault configuration
with every probe inside it, through the verifier's own machinery (repro.runner.run_arm and the
repro.engine job format), and judges each probe with the verifier's own rule
(repro.verdict.decide_probe) at every window length.

Windows come from one run: greedy decoding is deterministic and causal, so the first w tokens of
a 32-token generation are exactly the w-token generation. A fault is detected at window w iff
the verifier, given only the first w tokens, says FAIL (a reuse that reported a hit differs from
the baseline before index w). One extra arm re-runs a configuration with max_tokens 8 and checks
the claim (`prefix_check`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from repro import __version__, evaluate
from repro.atomic import write_bytes_atomic, write_json_atomic
from repro.provenance import allowed_env, hardware, kit_commit, package_version, utc_now
from repro.runner import child_env, run_arm
from repro.verdict import FAIL, INCONCLUSIVE, PASS, Request, decide_probe

KIND = "kvkit-detection-matrix"
# 1: first version (faults x positions x windows, controls, prefix check).
SCHEMA_VERSION = 1
WINDOWS = (8, 16, 32)
MAX_TOKENS = max(WINDOWS)
PREFIX_CHECK_WINDOW = 8
LOGPROBS = 5
BLOCK_SIZE = 16
DEFAULT_MODEL_SEED = 1234  # repro.tinymodel.MODEL_SEED: the model every fault arm runs on
# Two models x five prompts = ten (model, prompt) pairs per control arm; each arm costs an engine
# start (about 50 s on two shared cores), which is what bounds this list.
CONTROL_MODEL_SEEDS = (1234, 1)
CONTROL_REUSES = 2
# first_block of each position: the first loaded block, and the last one.
POSITIONS = {"head": 0, "tail": -1}
# One block (16 tokens) per fault: the smallest unit a block-granular cache can get wrong.
FAULT_PARAMS = {
    "zero_blocks": {"num_blocks": 1},
    "shift_blocks": {"num_blocks": 1},
    "stale": {"num_blocks": 1},
    "swap_kv": {"num_blocks": 1},
    "corrupt_layer": {"num_blocks": 1, "layer": 0, "scale": 1.0},
    "overwrite_tail": {"num_blocks": 1, "scale": 1.0},
    "drop_tail": {"num_blocks": 1},
}
PREFIX_CHECK_FAULT = ("zero_blocks", "head")
DEFAULT_REPORT = "reports/detection/detection-matrix.json"
# Beside the report, committed with it (site/ is the report site's generated, ignored output).
DEFAULT_SITE = "reports/detection/detection.html"
TEMPLATE = "detection.html.j2"
METHOD = (
    "Greedy decoding is deterministic and causal: the first w tokens of a 32-token generation are "
    "exactly the w-token generation. So one 32-token run per arm gives every window: a probe is "
    "detected at window w iff the verifier's rule (repro.verdict.decide_probe) on the first w tokens "
    "says FAIL, i.e. a reuse that reported a hit differs from the baseline at an index below w. "
    "prefix_check re-runs one arm with max_tokens 8 and compares it with the prefix."
)

_FILLERS = (
    "Release notes, section four. The scheduler keeps a queue of waiting requests and admits them when "
    "blocks are free; a cache hit lets it skip the prefill of the shared prefix.",
    "Maintenance log. Pump B pressure drifted low at 03:14; the operator reset the valve and logged the "
    "reading. Cooling loop two reported a stale sensor value at 04:40.",
    "Meeting minutes. The team agreed to pin every dependency, to record provenance with each report, and "
    "to treat a missing counter as missing evidence rather than as zero.",
)
# (name, prompt length in tokens); lengths avoid (L-1) % 16 == 0, where ExampleConnector cannot hit.
# The names lead the system message, so no two prompts share their first block.
PROMPTS = (("alpha", 389), ("bravo", 421), ("charlie", 453), ("delta", 300), ("echo", 350))
# Stored first, never reused: every fault probe then has an older *other* prompt for `stale`, and
# it is the longest, so it has a block at every index the probes load.
DECOY = ("decoy", 485)


def prompt_spec(name: str, length: int) -> dict:
    """A chat prompt of exactly `length` tokens, as the engine job's `prompt.chat`."""
    i = sum(map(ord, name)) % len(_FILLERS)
    return {
        "messages": [
            {"role": "system", "content": f"{name.capitalize()} probe. You are a careful assistant."},
            {"role": "user", "content": "Summarize these notes in one sentence.\n\n"},
        ],
        "length": length,
        "filler": _FILLERS[i],
    }


# ---- pure core: windows, cells, summary ---------------------------------------------------------


def window_verdicts(
    baseline: list[int], cold: Request, reuses: list[Request], windows: tuple[int, ...] = WINDOWS
) -> dict[int, str]:
    """The verifier's probe verdict had it generated only w tokens, for each window w."""
    out = {}
    for w in windows:
        cut = [Request(tuple(r.token_ids[:w]), r.cached_tokens) for r in reuses]
        out[w] = decide_probe(tuple(baseline[:w]), Request(tuple(cold.token_ids[:w]), cold.cached_tokens), cut).verdict
    return out


@dataclass(frozen=True)
class Cell:
    """One (fault, position, window) over its probes."""

    status: str  # detected | partial | missed | inconclusive | error
    detected: int
    probes: int


def summarize_cell(verdicts: list[str]) -> Cell:
    """detected: every probe FAIL; partial: some; missed: all PASS; else inconclusive (or error)."""
    n, fails = len(verdicts), sum(v == FAIL for v in verdicts)
    if n == 0 or any(v not in (PASS, FAIL, INCONCLUSIVE) for v in verdicts):
        return Cell("error", fails, n)
    if fails == n:
        return Cell("detected", fails, n)
    if fails:
        return Cell("partial", fails, n)
    if all(v == PASS for v in verdicts):
        return Cell("missed", 0, n)
    return Cell("inconclusive", 0, n)


def summarize(faults: list[dict], controls: list[dict], prefix_ok: bool) -> dict:
    """Whether every fault kind is detected somewhere, the misses, and the false positives.

    A kind is detected when, at some position and window, the verifier's arm verdict is FAIL: an
    arm takes its worst probe, so one diverging probe is enough. It is reliably detected when
    every probe of some cell diverged.
    """
    detected: dict[str, bool] = {}
    reliable: dict[str, bool] = {}
    missed = []
    for f in faults:
        cells = f["windows"].values()
        detected[f["fault"]] = detected.get(f["fault"], False) or any(c["detected"] > 0 for c in cells)
        reliable[f["fault"]] = reliable.get(f["fault"], False) or any(c["status"] == "detected" for c in cells)
        missed += [
            f"{f['fault']}/{f['position']}@{w}:{c['status']}"
            for w, c in sorted(f["windows"].items(), key=lambda x: int(x[0]))
            if c["status"] != "detected"
        ]
    fp = sum(c["false_positives"][str(max(WINDOWS))] for c in controls)
    exercised = sum(c["reuses_exercised"] for c in controls)
    errors = [f"{f['fault']}/{f['position']}" for f in faults if f["error"]] + [
        c["arm"] for c in controls if c["error"]
    ]
    every = bool(detected) and all(detected.values())
    ok = every and fp == 0 and exercised > 0 and prefix_ok and not errors
    return {
        "fault_kinds_detected": detected,
        "every_fault_detected": every,
        "fault_kinds_reliably_detected": reliable,
        "every_fault_reliably_detected": bool(reliable) and all(reliable.values()),
        "not_fully_detected_cells": missed,
        "false_positives": fp,
        "control_reuses_exercised": exercised,
        "arm_errors": errors,
        "prefix_check_ok": prefix_ok,
        "ok": ok,
    }


def judge_probe(base_probe: dict, probe: dict) -> dict:
    """One probe of a reuse arm against the baseline's, at every window; the per-request first
    diffs and margins are the verifier's own (repro.evaluate.judge_probe over the full run)."""
    judged = evaluate.judge_probe(probe, base_probe, "connector")
    cold, *reuses = judged["requests"]
    view = [Request(tuple(r["token_ids"]), r.get("cached_tokens")) for r in judged["requests"]]
    verdicts = window_verdicts(base_probe["requests"][0]["token_ids"], view[0], view[1:])
    diffs = [r["first_diff"] for r in reuses]
    first = min((d for d in diffs if d is not None), default=None)
    margin = next((r["margin"] for r in reuses if r["first_diff"] == first and first is not None), None)
    return {
        "name": probe["name"],
        "prompt_tokens": len(probe["prompt_token_ids"]),
        "cold_cached_tokens": cold.get("cached_tokens"),
        "cold_first_diff": cold["first_diff"],
        "reuse_cached_tokens": [r.get("cached_tokens") for r in reuses],
        "reuse_first_diffs": diffs,
        "first_diff": first,
        "margin": margin,
        "verdicts": {str(w): v for w, v in verdicts.items()},
    }


# ---- planning and running arms (I/O) -----------------------------------------------------------


def _engine(model: str) -> dict:
    return {
        "model": model,
        "revision": None,
        "dtype": "float32",
        "seed": 0,
        "gpu_memory_utilization": 0.1,
        "max_model_len": 2048,
        "block_size": BLOCK_SIZE,
        "device": "cpu",
    }


def _job(
    name: str,
    mode: str,
    connector: dict | None,
    model: str,
    probes: list[tuple[str, int, int]],
    max_tokens: int = MAX_TOKENS,
) -> dict:
    return {
        "arm": {"name": name, "mode": mode, "connector": connector},
        "engine": _engine(model),
        "max_tokens": max_tokens,
        "logprobs": LOGPROBS,
        "probes": [{"name": n, "prompt": {"chat": prompt_spec(n, length)}, "requests": k} for n, length, k in probes],
    }


def _planted(scratch: Path, name: str, fault: str, params: dict) -> dict:
    store = scratch / f"{name}.store"
    return {
        "name": "PlantedFaultConnector",
        "module_path": "repro.engine.connectors.planted_fault",
        "extra_config": {
            "store_dir": str(store),
            "fault": fault,
            "audit_path": str(scratch / f"{name}.audit.jsonl"),
            **params,
        },
    }


@dataclass
class Runner:
    """Runs one arm at a time (the engines share two cores) and keeps the scratch directory."""

    work: Path
    env: dict
    timeout_s: float

    def run(self, job: dict) -> tuple[dict | None, dict | None]:
        name = job["arm"]["name"]
        print(f"[kvkit] detection arm {name} ...", file=sys.stderr, flush=True)
        out = run_arm(
            job, workdir=self.work, log_path=self.work / f"{name}.log", env=self.env, timeout_s=self.timeout_s
        )
        print(
            f"[kvkit] detection arm {name}: {'ok' if out.failure is None else out.failure['kind']} ({out.wall_s:.0f} s)",
            file=sys.stderr,
            flush=True,
        )
        failure = None if out.failure is None else {k: out.failure[k] for k in ("kind", "detail", "log_tail")}
        return out.result, failure


def _read_audit(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _compare_error(baseline: dict | None, result: dict | None, failure: dict | None) -> dict | None:
    if failure is not None:
        return failure
    if baseline is None:
        return {"kind": "no-baseline", "detail": "the baseline arm failed: nothing to compare with", "log_tail": ""}
    problems = evaluate.comparability_problems(baseline, result)
    if problems:
        return {"kind": "not-comparable", "detail": "; ".join(problems), "log_tail": ""}
    return None


def fault_entry(
    fault: str,
    position: str,
    params: dict,
    result: dict | None,
    error: dict | None,
    baseline: dict | None,
    audit: list[dict],
) -> dict:
    """The matrix row of one fault arm: per-probe evidence and one cell per window."""
    entry = {
        "fault": fault,
        "position": position,
        "params": params,
        "error": error,
        "probes": [],
        "windows": {str(w): Cell("error", 0, 0).__dict__ for w in WINDOWS},
    }
    if error is not None:
        return entry
    base = {p["name"]: p for p in baseline["probes"]}
    loads = iter(audit)
    for probe in result["probes"]:
        loaded = [
            next(loads, None)
            for r in probe["requests"]
            if ((r.get("kv_transfer_params") or {}).get("planted_fault") or {}).get("loaded_tokens")
        ]
        if probe["name"] == DECOY[0]:
            continue
        row = judge_probe(base[probe["name"]], probe)
        reuse = probe["requests"][-1]
        row["faulted_blocks"] = ((reuse.get("kv_transfer_params") or {}).get("planted_fault") or {}).get(
            "faulted_blocks"
        )
        row["kv_audit"] = loaded[-1] if loaded else None
        entry["probes"].append(row)
    for w in WINDOWS:
        entry["windows"][str(w)] = summarize_cell([p["verdicts"][str(w)] for p in entry["probes"]]).__dict__
        entry["windows"][str(w)]["first_diffs"] = [
            p["first_diff"] if p["verdicts"][str(w)] == FAIL else None for p in entry["probes"]
        ]
    return entry


def control_entry(arm: str, seed: int, result: dict | None, error: dict | None, baseline: dict | None) -> dict:
    entry = {
        "arm": arm,
        "model_seed": seed,
        "error": error,
        "probes": [],
        "reuses_compared": 0,
        "reuses_exercised": 0,
        "false_positives": {str(w): 0 for w in WINDOWS},
        "inconclusive": {str(w): 0 for w in WINDOWS},
    }
    if error is not None:
        return entry
    base = {p["name"]: p for p in baseline["probes"]}
    for probe in result["probes"]:
        row = judge_probe(base[probe["name"]], probe)
        entry["probes"].append(row)
        entry["reuses_compared"] += len(row["reuse_cached_tokens"])
        entry["reuses_exercised"] += sum(1 for c in row["reuse_cached_tokens"] if c)
        for w, v in row["verdicts"].items():
            entry["false_positives"][w] += v == FAIL
            entry["inconclusive"][w] += v == INCONCLUSIVE
    return entry


def prefix_check(short: dict | None, full: dict | None, window: int) -> dict:
    """Every request of the short run equals the first `window` tokens (and logprobs) of the full run."""
    if short is None or full is None:
        return {"window": window, "ok": False, "requests_compared": 0, "detail": "an arm failed"}
    full_reqs = {p["name"]: p["requests"] for p in full["probes"]}
    n, mismatched, lp_diff = 0, [], 0.0
    for p in short["probes"]:
        for i, (s, f) in enumerate(zip(p["requests"], full_reqs.get(p["name"], []))):
            n += 1
            if s["token_ids"] != f["token_ids"][:window]:
                mismatched.append(f"{p['name']}#{i}")
            for a, b in zip(s["logprobs"], f["logprobs"][:window]):
                if a and b and a[0][0] == b[0][0]:
                    lp_diff = max(lp_diff, abs(a[0][1] - b[0][1]))
    return {
        "window": window,
        "ok": n > 0 and not mismatched,
        "requests_compared": n,
        "mismatched": mismatched,
        "max_top1_logprob_abs_diff": round(lp_diff, 9),
        "detail": "token IDs of every request compared exactly",
    }


def _prepare_models(models_dir: Path, seeds: tuple[int, ...]) -> dict[int, tuple[str, str]]:
    """{seed: (model directory, SHA-256)}; the default seed uses the kit's usual model directory."""
    from repro.tinymodel import MODEL_NAME, make_tiny_model

    out = {}
    for seed in sorted(set(seeds) | {DEFAULT_MODEL_SEED}):
        path = models_dir / (MODEL_NAME if seed == DEFAULT_MODEL_SEED else f"{MODEL_NAME}-seed{seed}")
        out[seed] = (str(path.resolve()), make_tiny_model(path, seed))
    return out


def _probe_plan(requests: int) -> list[tuple[str, int, int]]:
    return [(n, length, requests) for n, length in PROMPTS]


def run_controls(runner: Runner, models: dict, seeds: tuple[int, ...]) -> tuple[dict, list[dict]]:
    """Per model seed: the baseline, then ExampleConnector, native and the planted connector with
    fault none. Returns the default model's baseline result too (the fault arms compare with it)."""
    baselines, entries = {}, []
    for seed in sorted(set(seeds) | {DEFAULT_MODEL_SEED}):
        model = models[seed][0]
        base, failure = runner.run(_job(f"baseline-seed{seed}", "baseline", None, model, _probe_plan(1)))
        baselines[seed] = None if failure else base
        if seed not in seeds:
            continue
        arms = [
            (
                "ExampleConnector",
                "connector",
                {
                    "name": "ExampleConnector",
                    "module_path": None,
                    "extra_config": {"shared_storage_path": str(runner.work / f"example-{seed}")},
                },
            ),
            ("native", "native", None),
            ("PlantedFault-none", "connector", _planted(runner.work, f"none-{seed}", "none", {})),
        ]
        for name, mode, conn in arms:
            result, failure = runner.run(_job(f"{name}-seed{seed}", mode, conn, model, _probe_plan(1 + CONTROL_REUSES)))
            error = _compare_error(baselines[seed], result, failure)
            entries.append(control_entry(name, seed, result, error, baselines[seed]))
            if conn and conn["name"] == "PlantedFaultConnector":
                audit = _read_audit(Path(conn["extra_config"]["audit_path"]))
                # a faithful load must be bit-exact: the connector itself adds no noise
                entries[-1]["kv_audit"] = {
                    "loads": len(audit),
                    "max_abs_diff": max((a["clean_max_abs_diff"] for a in audit), default=None),
                }
    return baselines, entries


def _fault_job(runner: Runner, fault: str, position: str, model: str, max_tokens: int) -> dict:
    params = dict(FAULT_PARAMS[fault], first_block=POSITIONS[position])
    name = f"{fault}-{position}" + ("" if max_tokens == MAX_TOKENS else f"-{max_tokens}tok")
    probes = [(DECOY[0], DECOY[1], 1)] + _probe_plan(2)
    return _job(name, "connector", _planted(runner.work, name, fault, params), model, probes, max_tokens)


def run_faults(runner: Runner, model: str, baseline: dict | None, faults: tuple[str, ...]) -> tuple[list[dict], dict]:
    entries, results = [], {}
    for fault in faults:
        for position in POSITIONS:
            job = _fault_job(runner, fault, position, model, MAX_TOKENS)
            result, failure = runner.run(job)
            results[(fault, position)] = result
            audit = _read_audit(Path(job["arm"]["connector"]["extra_config"]["audit_path"]))
            params = {
                k: v for k, v in job["arm"]["connector"]["extra_config"].items() if k not in ("store_dir", "audit_path")
            }
            entries.append(
                fault_entry(fault, position, params, result, _compare_error(baseline, result, failure), baseline, audit)
            )
    check = {"window": PREFIX_CHECK_WINDOW, "ok": False, "requests_compared": 0, "detail": "not run"}
    if PREFIX_CHECK_FAULT in results:
        job = _fault_job(runner, *PREFIX_CHECK_FAULT, model, PREFIX_CHECK_WINDOW)
        short, _failure = runner.run(job)
        check = dict(
            prefix_check(short, results[PREFIX_CHECK_FAULT], PREFIX_CHECK_WINDOW),
            arm=job["arm"]["name"],
            compared_with=f"{PREFIX_CHECK_FAULT[0]}-{PREFIX_CHECK_FAULT[1]}",
        )
    return entries, check


def build_report(
    faults: list[dict],
    controls: list[dict],
    check: dict,
    models: dict,
    argv: list[str],
    env: dict,
    started: str,
    wall_s: float,
) -> dict:
    return {
        "kind": KIND,
        "schema_version": SCHEMA_VERSION,
        "tool_version": __version__,
        "claim_eligible": False,
        "method": METHOD,
        "config": {
            "windows": list(WINDOWS),
            "max_tokens": MAX_TOKENS,
            "block_size": BLOCK_SIZE,
            "dtype": "float32",
            "device": "cpu",
            "decoding": "greedy, ignore_eos, enforce_eager",
            "logprobs": LOGPROBS,
            "positions": POSITIONS,
            "fault_params": FAULT_PARAMS,
            "prompts": [list(p) for p in PROMPTS],
            "decoy": list(DECOY),
            "fault_model_seed": DEFAULT_MODEL_SEED,
            "control_model_seeds": sorted({c["model_seed"] for c in controls}),
            "control_reuses": CONTROL_REUSES,
            "models": {str(s): {"sha256": sha} for s, (_, sha) in sorted(models.items())},
        },
        "faults": faults,
        "controls": controls,
        "prefix_check": check,
        "summary": summarize(faults, controls, bool(check.get("ok"))),
        # Diagnostics only (how long `make detection` takes here), never a performance claim.
        "diagnostics": {"wall_s": round(wall_s, 1)},
        "provenance": {
            "kit": kit_commit(),
            "argv": argv,
            "started_utc": started,
            "ended_utc": utc_now(),
            "hardware": hardware(),
            "packages": {n: package_version(n) for n in ("torch", "vllm", "transformers")},
            "env": allowed_env(env),
        },
    }


def run_detection(
    report_path: Path,
    models_dir: Path,
    seeds: tuple[int, ...],
    faults: tuple[str, ...],
    timeout_s: float,
    argv: list[str],
) -> dict:
    started, t0 = utc_now(), time.monotonic()
    report_path.parent.mkdir(parents=True, exist_ok=True)
    env = child_env(dict(os.environ), hashseed="0", extra={})
    models = _prepare_models(models_dir, seeds)
    work = Path(tempfile.mkdtemp(prefix=".detection.work-", dir=report_path.parent))
    try:
        runner = Runner(work=work, env=env, timeout_s=timeout_s)
        baselines, controls = run_controls(runner, models, seeds)
        faults_out, check = run_faults(runner, models[DEFAULT_MODEL_SEED][0], baselines[DEFAULT_MODEL_SEED], faults)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report = build_report(faults_out, controls, check, models, argv, env, started, time.monotonic() - t0)
    write_json_atomic(report_path, report)
    return report


# ---- the page ------------------------------------------------------------------------------------


def load_matrix(path: Path) -> dict:
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    if data.get("kind") != KIND:
        raise ValueError(f"{path} is not a {KIND} report")
    if data.get("schema_version") != SCHEMA_VERSION:
        raise ValueError(
            f"{path} has schema_version {data.get('schema_version')}; this kit reads {SCHEMA_VERSION}"
            + (" (upgrade the kit)" if data.get("schema_version", 0) > SCHEMA_VERSION else "")
        )
    return data


def page_model(report: dict) -> dict:
    """What the template prints: rows of strings, no logic left for the template."""
    windows = [str(w) for w in report["config"]["windows"]]
    rows = []
    for f in report["faults"]:
        audits = [p["kv_audit"] for p in f["probes"] if p.get("kv_audit")]
        diffs = [d for a in audits for _, d in a["faulted_max_abs_diff"]]
        cells = []
        for w in windows:
            c = f["windows"][w]
            shown = ",".join(str(d) for d in c.get("first_diffs", []) if d is not None)
            cells.append(
                {"status": c["status"], "text": f"{c['detected']}/{c['probes']}" + (f" @{shown}" if shown else "")}
            )
        margins = [
            p["margin"]["baseline_margin"]
            for p in f["probes"]
            if p.get("margin") and p["margin"]["baseline_margin"] is not None
        ]
        rows.append(
            {
                "fault": f["fault"],
                "position": f["position"],
                "params": ", ".join(f"{k}={v}" for k, v in sorted(f["params"].items()) if k != "fault"),
                "cells": cells,
                "error": f"{f['error']['kind']}: {f['error']['detail']}" if f["error"] else "",
                "kv_changed": f"{sum(1 for d in diffs if d > 0)}/{len(diffs)} blocks, min max|Δ| {min(diffs):.3g}"
                if diffs
                else "no faulted block",
                "min_margin": f"{min(margins):.3f}" if margins else "–",
            }
        )
    controls = [
        {
            "arm": c["arm"],
            "seed": c["model_seed"],
            "compared": c["reuses_compared"],
            "exercised": c["reuses_exercised"],
            "fp": [c["false_positives"][w] for w in windows],
            "inconclusive": [c["inconclusive"][w] for w in windows],
            "error": f"{c['error']['kind']}: {c['error']['detail']}" if c["error"] else "",
        }
        for c in report["controls"]
    ]
    s = report["summary"]
    return {
        "windows": windows,
        "rows": rows,
        "controls": controls,
        "summary": s,
        "method": report["method"],
        "prefix": report["prefix_check"],
        "started": report["provenance"]["started_utc"],
        "commit": report["provenance"]["kit"].get("commit", "unavailable"),
        "kinds": [
            {"fault": k, "detected": v, "reliable": s["fault_kinds_reliably_detected"][k]}
            for k, v in sorted(s["fault_kinds_detected"].items())
        ],
        "tool_version": report["tool_version"],
    }


def render_page(report: dict) -> str:
    from repro.publish.environment import make_environment

    env = make_environment()
    return env.get_template(TEMPLATE).render(m=page_model(report))


def write_page(report: dict, site_path: Path) -> None:
    site_path.parent.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(site_path, render_page(report).encode("utf-8"))


def main(argv: list[str]) -> int:
    """`python -m repro detection` (run, write the report and page) or `detection-site` (page only)."""
    cmd, rest = argv[0], argv[1:]
    p = argparse.ArgumentParser(prog=f"python -m repro {cmd}")
    p.add_argument("--report", default=DEFAULT_REPORT, help=f"the matrix report (default {DEFAULT_REPORT})")
    p.add_argument("--site", default=DEFAULT_SITE, help=f"the page (default {DEFAULT_SITE})")
    if cmd == "detection":
        p.add_argument("--models-dir", default=".cache/models", help="where the tiny models are generated")
        p.add_argument(
            "--seeds", default=",".join(map(str, CONTROL_MODEL_SEEDS)), help="control model seeds, comma separated"
        )
        p.add_argument("--faults", default=",".join(FAULT_PARAMS), help="fault kinds, comma separated")
        p.add_argument("--timeout", type=float, default=600.0, help="seconds per arm")
    a = p.parse_args(rest)
    if cmd == "detection":
        faults = tuple(f for f in a.faults.split(",") if f)
        unknown = [f for f in faults if f not in FAULT_PARAMS]
        if unknown:
            print(
                f"error: unknown fault kind(s) {', '.join(unknown)}; choose from {', '.join(FAULT_PARAMS)}",
                file=sys.stderr,
            )
            return 2
        seeds = tuple(int(s) for s in a.seeds.split(",") if s)
        report = run_detection(Path(a.report), Path(a.models_dir), seeds, faults, a.timeout, [cmd, *rest])
    else:
        report = load_matrix(Path(a.report))
    write_page(report, Path(a.site))
    s = report["summary"]
    print(
        f"detection: every fault detected={s['every_fault_detected']} "
        f"(on every probe of some cell: {s['every_fault_reliably_detected']}) false_positives={s['false_positives']} "
        f"control reuses exercised={s['control_reuses_exercised']} prefix_check={s['prefix_check_ok']} "
        f"errors={len(s['arm_errors'])}"
    )
    for cell in s["not_fully_detected_cells"]:
        print(f"  not fully detected: {cell}")
    print(f"report: {a.report}\npage: {a.site}", file=sys.stderr)
    return 0 if s["ok"] else (3 if s["arm_errors"] else 1)
