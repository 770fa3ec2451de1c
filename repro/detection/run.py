"""Running the detection study: models, arms through repro.run.runner.run_arm, and the matrix report written atomically."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from repro import __version__
from repro.contract.job import Job
from repro.contract.result import ArmResult
from repro.detection import catalogue, plan
from repro.detection.blame import control_blame, drop_unreferenced, fault_blame
from repro.detection.matrix import compare_error, control_entry, fault_entry, prefix_check, summarize
from repro.errors import UsageError
from repro.judge import kvaudit
from repro.models.registry import SOURCE_FILE, packaged_model
from repro.models.tiny import MODEL_NAME, MODEL_SEED, make_tiny_model
from repro.record.atomic import write_json_atomic
from repro.record.provenance import (
    model_record,
    model_source,
    package_version,
    study_provenance,
    utc_now,
)
from repro.run.kvaudit import run_compare
from repro.run.runner import child_env, run_arm


@dataclass
class Audited:
    """One arm to compare with its model's baseline once that model's arms ran: its matrix entry
    (filled in place with the audit column), its result, and how to fill it."""

    arm: str  # the job's arm name (the comparison's key)
    mode: str
    entry: dict
    result: dict | None
    fault: bool


@dataclass
class Runner:
    """Runs one arm at a time (the engines share two cores) and keeps the scratch directory."""

    work: Path
    env: dict
    timeout_s: float
    audited: dict[int, list[Audited]] = field(default_factory=dict)  # per model seed

    def run(self, job: Job) -> tuple[dict | None, dict | None]:
        """The arm's result and failure in their JSON form (what the pure matrix code reads)."""
        name = job.arm.name
        print(f"[kvkit] detection arm {name} ...", file=sys.stderr, flush=True)
        out = run_arm(
            job, workdir=self.work, log_path=self.work / f"{name}.log", env=self.env, timeout_s=self.timeout_s
        )
        status = "ok" if out.failure is None else out.failure.kind
        print(f"[kvkit] detection arm {name}: {status} ({out.wall_s:.0f} s)", file=sys.stderr, flush=True)
        return (None if out.result is None else out.result.to_json()), (out.failure and out.failure.to_json())


def read_audit(job: Job) -> list[dict]:
    """The planted connector's load audit of this job's arm (one JSON line per load)."""
    path = Path(job.arm.connector.extra_config["audit_path"])
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def prepare_models(models_dir: Path, seeds: tuple[int, ...]) -> dict[int, tuple[str, str]]:
    """{seed: (model directory, SHA-256)}; MODEL_SEED uses the kit's usual model directory."""
    out = {}
    for seed in sorted(set(seeds) | {MODEL_SEED}):
        path = models_dir / (MODEL_NAME if seed == MODEL_SEED else f"{MODEL_NAME}-seed{seed}")
        out[seed] = (str(path.resolve()), make_tiny_model(path, seed))
    return out


def prepare_trained(models_dir: Path, name: str) -> tuple[dict[str, tuple[str, str]], dict]:
    """({name: (converted folder, SHA-256)}, its provenance record with `source`, as the verifier's reports
    record it) of a packaged model `make model MODEL=name` converted; an unknown name, or a folder not
    converted yet, is one line (exit 2)."""
    folder = models_dir / packaged_model(name).folder().name
    source = model_source(str(folder))
    if not isinstance(source, dict):
        raise UsageError(
            f"{folder}: no converted model ({SOURCE_FILE} "
            f"{'missing' if source is None else source.removeprefix('unavailable: ')}); run `make model MODEL={name}`"
        )
    record = model_record(str(folder.resolve()))
    return {name: (record["name"], record["sha256"])}, record


def run_controls(
    runner: Runner, models: dict, seeds: tuple[int, ...], faults: tuple[str, ...] = ()
) -> tuple[dict, list[dict]]:
    """Per model (its seed, or a packaged model's name): the baseline, then the no-fault control arms (those the
    faults call for among them, plan.control_jobs). Returns every model's baseline result too (the fault arms
    compare with their model's)."""
    baselines, entries = {}, []
    for seed in sorted(models):
        model = models[seed][0]
        base, failure = runner.run(plan.baseline_job(runner.work, seed, model, plan.needs_between(faults)))
        baselines[seed] = None if failure else base
        if seed not in seeds:
            continue
        for name, job in plan.control_jobs(runner.work, seed, model, faults):
            result, failure = runner.run(job)
            error = compare_error(baselines[seed], result, failure)
            entry = control_entry(name, seed if isinstance(seed, int) else None, result, error, baselines[seed])
            if not isinstance(seed, int):
                entry["model"] = seed  # a packaged model has no seed
            runner.audited.setdefault(seed, []).append(Audited(job.arm.name, job.arm.mode, entry, result, False))
            if job.arm.connector and job.arm.connector.name == "PlantedFaultConnector":
                audit = read_audit(job)
                # a faithful load must be bit-exact: the connector itself adds no noise
                entry["kv_audit"] = {
                    "loads": len(audit),
                    "max_abs_diff": max((a["clean_max_abs_diff"] for a in audit), default=None),
                }
            entries.append(entry)
    return baselines, entries


def run_faults(
    runner: Runner, model: str, baseline: dict | None, faults: tuple[str, ...], key: int | str = MODEL_SEED
) -> tuple[list[dict], dict]:
    """Every fault at every position, then the prefix check (a short re-run of one of them); `key` is the
    fault model's (its seed, or a packaged model's name)."""
    entries, results = [], {}
    for fault in faults:
        for position in plan.positions_of(fault):
            job = plan.fault_job(runner.work, fault, position, model)
            result, failure = runner.run(job)
            results[(fault, position)] = result
            params = {k: v for k, v in job.arm.connector.extra_config.items() if k not in ("store_dir", "audit_path")}
            error = compare_error(baseline, result, failure)
            entries.append(fault_entry(fault, position, params, result, error, baseline, read_audit(job)))
            row = catalogue.row(fault, position)
            if row is not None:  # what the row expects, as the catalogue wrote it before the run
                entries[-1]["expectation"] = row.to_json()["expectation"]
                if row.kv_cache_tokens is not None:
                    entries[-1]["kv_cache_tokens"] = row.kv_cache_tokens
                if row.between:  # the prompt sent between each cold request and its reuse, by probe
                    entries[-1]["between"] = {n: plan.BETWEEN[n][0] for n, _ in plan.PROMPTS}
            runner.audited.setdefault(key, []).append(Audited(job.arm.name, job.arm.mode, entries[-1], result, True))
    check = {"window": plan.PREFIX_CHECK_WINDOW, "ok": False, "requests_compared": 0, "detail": "not run"}
    if plan.PREFIX_CHECK_FAULT in results:
        job = plan.fault_job(runner.work, *plan.PREFIX_CHECK_FAULT, model, plan.PREFIX_CHECK_WINDOW)
        short, _failure = runner.run(job)
        check = dict(
            prefix_check(short, results[plan.PREFIX_CHECK_FAULT], plan.PREFIX_CHECK_WINDOW),
            arm=job.arm.name,
            compared_with="-".join(plan.PREFIX_CHECK_FAULT),
        )
    return entries, check


def audit_seed(runner: Runner, seed: int | str, baseline: dict | None, arms: list[Audited]) -> dict:
    """Compare every audited arm of one model with that model's baseline (one comparison child) and
    fill each arm's audit column; returns what the reference and the comparison were."""
    t0 = time.monotonic()
    raw, problem = None, None
    ref = None if baseline is None else ArmResult.from_json(baseline)
    ok = [a for a in arms if a.result is not None and a.entry["error"] is None]
    if ref is None:
        problem = "the baseline arm failed: no reference KV"
    elif ref.kv_audit is None:
        problem = "the baseline recorded no reference KV"
    elif ok:
        print(
            f"[kvkit] detection KV audit, model {'seed ' if isinstance(seed, int) else ''}{seed}: {len(ok)} arms ...",
            file=sys.stderr,
            flush=True,
        )
        job = kvaudit.compare_job(ref, {a.arm: ArmResult.from_json(a.result) for a in ok})
        job = drop_unreferenced(job, {p.name for p in ref.probes})
        work = runner.work / f"kv-compare-{plan.model_tag(seed)}"
        work.mkdir(parents=True, exist_ok=True)
        raw, problem = run_compare(job, work, runner.env, sys.executable, runner.timeout_s)
    for a in arms:
        if a.fault:
            fault_blame(a.entry, a.result, a.arm, raw, problem, plan.BLOCK_SIZE)
        else:
            control_blame(a.entry, a.result, a.arm, a.mode, raw, problem, plan.BLOCK_SIZE)
    return {
        "baseline": None if ref is None else ref.arm,
        **reference_of(ref),
        "arms": [a.arm for a in arms],
        "problem": problem,
        "wall_s": round(time.monotonic() - t0, 1),
    }


def reference_of(ref: ArmResult | None) -> dict:
    """The probes whose reference KV the baseline recorded, and the errors its audit recorded."""
    if ref is None:
        return {"reference_probes": [], "reference_errors": []}
    errors = (ref.kv_audit or {}).get("errors") or []
    return {
        "reference_probes": sorted(
            p.name for p in ref.probes if p.requests and (p.requests[0].kv_audit_record or {}).get("seq") is not None
        ),
        "reference_errors": [f"{e.get('where', '?')}: {str(e.get('error', '')).strip()[-200:]}" for e in errors],
    }


def run_settings() -> dict:
    """How every arm of a study generates (the first keys of a study report's config)."""
    return {
        "windows": list(plan.WINDOWS),
        "max_tokens": plan.MAX_TOKENS,
        "block_size": plan.BLOCK_SIZE,
        "dtype": "float32",
        "device": "cpu",
        "decoding": "greedy, ignore_eos, enforce_eager",
        "logprobs": plan.LOGPROBS,
    }


def provenance(argv: list[str], env: dict, started: str) -> dict:
    """A study report's provenance: the kit's commit, the command, its UTC times, hardware, versions, env."""
    return study_provenance(argv, env, started, {n: package_version(n) for n in ("torch", "vllm", "transformers")})


def build_report(
    faults: list[dict],
    controls: list[dict],
    check: dict,
    kv: dict,
    models: dict,
    argv: list[str],
    env: dict,
    started: str,
    wall_s: float,
    trained: dict | None = None,
) -> dict:
    """The matrix report. `trained`: a packaged model's provenance record (repro.record.provenance.model_record,
    its `source` from repro.models.convert), for a study of that model; None for the tiny models."""
    report = {
        "kind": plan.KIND,
        "schema_version": plan.SCHEMA_VERSION,
        "tool_version": __version__,
        "claim_eligible": False,
        "method": plan.METHOD,
        "config": {
            **run_settings(),
            "positions": plan.POSITIONS,
            "fault_positions": plan.FAULT_POSITIONS,
            "fault_params": plan.FAULT_PARAMS,
            "prompts": [list(p) for p in plan.PROMPTS],
            "decoy": list(plan.DECOY),
            "fault_model_seed": MODEL_SEED,
            "control_model_seeds": sorted({c["model_seed"] for c in controls}),
            "control_reuses": plan.CONTROL_REUSES,
            "kv_audit": True,
            "models": {str(s): {"sha256": sha} for s, (_, sha) in sorted(models.items())},
        },
        "faults": faults,
        "controls": controls,
        "prefix_check": check,
        "kv_audit": kv,
        "summary": summarize(faults, controls, bool(check.get("ok"))),
        # Diagnostics only (how long `make detection` takes here), never a performance claim.
        "diagnostics": {"wall_s": round(wall_s, 1)},
        "provenance": provenance(argv, env, started),
    }
    rows = [r.to_json() for r in catalogue.ROWS if r.fault in {f["fault"] for f in faults}]
    if rows:  # additive: a study without the catalogue's rows is written as it always was
        report["config"]["fault_rows"] = rows
    if trained is not None:  # additive: the tiny-model study's report stays as it was
        report["method"] = plan.trained_method(trained["source"])
        report["config"].update(model=next(iter(models)), fault_model_seed=None, control_model_seeds=[])
        report["provenance"]["model"] = trained
    return report


def run_detection(
    report_path: Path,
    models_dir: Path,
    seeds: tuple[int, ...],
    faults: tuple[str, ...],
    timeout_s: float,
    argv: list[str],
    model: str | None = None,
) -> dict:
    """Run every arm, write the matrix report (atomically) and return it. `model`: a packaged model's name
    (repro.models.registry), whose converted folder under models_dir runs the faults and the controls
    instead of the tiny models (`seeds` is then unused)."""
    started, t0 = utc_now(), time.monotonic()
    trained = None
    if model is None:
        models, key = prepare_models(models_dir, seeds), MODEL_SEED
    else:
        (models, trained), key = prepare_trained(models_dir, model), model
        seeds = (model,)
    report_path.parent.mkdir(parents=True, exist_ok=True)
    env = child_env(dict(os.environ), hashseed="0", extra={})
    work = Path(tempfile.mkdtemp(prefix=".detection.work-", dir=report_path.parent))
    try:
        runner = Runner(work=work, env=env, timeout_s=timeout_s)
        baselines, controls = run_controls(runner, models, seeds, faults)
        faults_out, check = run_faults(runner, models[key][0], baselines[key], faults, key)
        kv = {str(s): audit_seed(runner, s, baselines[s], arms) for s, arms in sorted(runner.audited.items())}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report = build_report(faults_out, controls, check, kv, models, argv, env, started, time.monotonic() - t0, trained)
    write_json_atomic(report_path, report)
    return report
