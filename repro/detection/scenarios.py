"""The detection study's scenario columns (`python -m repro detection --scenarios`): which planted faults each
workload scenario catches that plain probes miss.

Rows are planted-fault configurations (zero_blocks, head, 1 block, under a gate; and land_elsewhere, a load that
lands in a block another request reads, gated at 16 requests in flight), columns are `plain` (the study's own arm:
the decoy, then each prompt cold and once reused), one per shipped scenario re-declared over the study's prompts, and
production-load over prompts of its own (repro.detection.load_column); the plan of rows, columns and hypothesis is
repro.detection.scenario_plan's. A scenario cell runs through the verifier's scenario machinery (repro.run.scenarios:
its jobs, the cache-off schedule control, the judging of every request and the KV audit of scenario requests), not a
copy of it; the plain cells through the detection study's own jobs and matrix entries. What a cell says is
repro.detection.scenario_cells'.

The plan, written before any run, with its hypothesis: .notes/h2-detection-plan.md; docs/detection.md says
where the code forced a change of it (the preemption column).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from repro import __version__
from repro.contract.job import ArmSpec, EngineConfig, Job, build_job
from repro.contract.result import ArmResult
from repro.detection import load_column, plan
from repro.detection.matrix import compare_error, control_entry, fault_entry
from repro.detection.run import Audited, Runner, audit_seed, prepare_models, provenance, read_audit, run_settings
from repro.detection.scenario_cells import (
    KIND,
    SCHEMA_VERSION,
    control_cell,
    fault_cell,
    plain_records,
    scenario_records,
)
from repro.detection.scenario_plan import (  # re-exported: the study's plan, read by its tests and page
    COLUMNS,
    CONTROLS,
    FAULT,
    HYPOTHESIS,
    LOCAL_CAPACITY_BLOCKS,
    METHOD,
    PLAIN,
    POSITION,
    ROW_FAULTS,
    ROWS,
    SCENARIOS,
    row_fault,
    row_params,
)
from repro.models.tiny import MODEL_SEED
from repro.plan.arms import PlannedArm
from repro.plan.fixtures import Probe, Scenario
from repro.record.atomic import write_json_atomic
from repro.record.provenance import utc_now
from repro.run import load_scenario
from repro.run import scenarios as machinery
from repro.run.kvaudit import run_compare
from repro.run.runner import ArmOutcome, child_env, run_arm

DEFAULT_REPORT = "reports/detection/detection-scenarios.json"
DEFAULT_SITE = "reports/detection/detection-scenarios.html"
__all__ = ["COLUMNS", "LOCAL_CAPACITY_BLOCKS", "SCENARIOS"]  # of the plan, read through this module too


def scenario_paths() -> tuple[str, str]:
    return DEFAULT_REPORT, DEFAULT_SITE


def job_for(run: PlannedArm, scenario: Scenario, engine: EngineConfig, kv_dir: str | None) -> Job:
    """A scenario run's job: the verifier's (repro.run.scenarios.scenario_job) over the study's engine, sampling and
    prompts, so scenario runs and the plain baseline are comparable."""
    job = build_job(run.spec, engine, [], max_tokens=plan.MAX_TOKENS, logprobs=plan.LOGPROBS, kv_audit_dir=kv_dir)
    return machinery.scenario_job(job, scenario, probes())


def probes() -> list[Probe]:
    return [Probe(name, chat=plan.prompt_spec(name, length)) for name, length in plan.PROMPTS]


def planned_arms(scratch: Path, column: str) -> list[PlannedArm]:
    """The baseline (the schedule control), one planted arm per row, then the no-fault controls."""
    arms = [PlannedArm(ArmSpec("baseline", "baseline"))]
    for row, _, _ in ROWS:
        name = f"{row}-{column}"
        arms.append(
            PlannedArm(
                ArmSpec(row, "connector", plan.planted_connector(scratch, name, row_fault(row), row_params(row)))
            )
        )
    none = plan.planted_connector(scratch, f"none-{column}", "none", {})
    arms += [PlannedArm(ArmSpec(CONTROLS[0], "connector", none)), PlannedArm(ArmSpec(CONTROLS[1], "native"))]
    return arms


def plain_jobs(scratch: Path, model: str) -> list[tuple[str, Job]]:
    """(row or control, job) of the plain column: the detection study's fault arm with each row's gate, and
    its no-fault controls (each prompt cold and twice reused, as the study's controls run)."""
    jobs = []
    for row, _, _ in ROWS:
        probes_ = [(plan.DECOY[0], plan.DECOY[1], 1)] + plan.probe_plan(2)
        conn = plan.planted_connector(scratch, f"{row}-{PLAIN}", row_fault(row), row_params(row))
        jobs.append((row, plan.arm_job(f"{row}-{PLAIN}", "connector", conn, model, probes_, scratch=scratch)))
    controls = dict(plan.control_jobs(scratch, MODEL_SEED, model))
    jobs += [(name, controls[name]) for name in CONTROLS]
    return jobs


class Study:
    """Runs the arms one at a time (two shared cores), keeping each outcome and its wall time."""

    def __init__(self, runner: Runner, engine: EngineConfig) -> None:
        self.runner, self.engine = runner, engine
        self.walls: list[dict] = []

    def run(self, job: Job) -> ArmOutcome:
        name = job.arm.name
        print(f"[kvkit] detection-scenarios arm {name} ...", file=sys.stderr, flush=True)
        work = self.runner.work
        out = run_arm(
            job, workdir=work, log_path=work / f"{name}.log", env=self.runner.env, timeout_s=self.runner.timeout_s
        )
        status = "ok" if out.failure is None else out.failure.kind
        print(f"[kvkit] detection-scenarios arm {name}: {status} ({out.wall_s:.0f} s)", file=sys.stderr, flush=True)
        self.walls.append({"arm": name, "wall_s": round(out.wall_s, 1), "status": status})
        return out


def run_plain(study: Study, model: str, baseline: dict | None) -> tuple[dict, dict, list[Audited]]:
    """The plain column: {row: (entry, result)}, {control: (entry, result)} and what the KV audit compares."""
    rows, controls, audited = {}, {}, []
    for name, job in plain_jobs(study.runner.work, model):
        out = study.run(job)
        result = None if out.result is None else out.result.to_json()
        error = compare_error(baseline, result, out.failure and out.failure.to_json())
        if name in CONTROLS:
            entry = control_entry(name, MODEL_SEED, result, error, baseline)
            controls[name] = (entry, result)
        else:
            params = {k: v for k, v in job.arm.connector.extra_config.items() if k not in ("store_dir", "audit_path")}
            position = POSITION if name not in ROW_FAULTS else None
            entry = fault_entry(row_fault(name), position, params, result, error, baseline, read_audit(job))
            rows[name] = (entry, result)
        audited.append(Audited(job.arm.name, job.arm.mode, entry, result, name not in CONTROLS))
    return rows, controls, audited


def run_column(
    study: Study, scenario: Scenario, baseline: ArmResult | None, only: tuple[str, ...] | None = None
) -> tuple[dict, dict[str, ArmResult]]:
    """One scenario column through repro.run.scenarios: every arm's run (the control first), then its section
    (the control and every arm judged). Returns the section and the results the KV audit compares.
    `only`: these arms and the control (a test's short column)."""
    work = study.runner.work
    arms = [a for a in planned_arms(work, scenario.name) if only is None or a.name in (*only, "baseline")]
    runs, skipped = machinery.runs_of(scenario, arms)
    done = []
    for original, run in runs:
        run, record = machinery.prepare(run, scenario, work, [], work, None)
        kv_dir = str(plan.kv_audit_dir(work, run.name))
        job = job_for(run, scenario, study.engine, kv_dir)
        done.append((original, run, study.run(job), record))
    section = machinery.section(scenario, done, skipped, baseline, "logs")
    results = {
        run.name: out.result
        for original, run, out, _ in done
        if original.spec.mode != "baseline"
        and out.failure is None
        and out.result is not None
        and not load_scenario.is_control(run.name)
    }  # fmt: skip (a load scenario's reuse control is not a cell's: its KV is not compared here)
    # each arm's own run (a load scenario's reference and reuse control are the baseline's and native's too)
    section["run_names"] = {o.name: run.name for o, run, _, _ in done if not load_scenario.is_control(run.name)}
    if scenario.load is not None:  # what its arms' KV is compared with (popped with run_names)
        section["reference_result"] = load_column.reference_of(done)
    return section, results


def audit_columns(study: Study, baseline: ArmResult | None, sections: list[dict], results: dict) -> dict:
    """The KV audit of every scenario request (one comparison child per reference, as the verifier runs it) and each
    arm's KV fields filled in place (repro.run.scenarios.annotate_kv). The production-load column is compared with its
    own reference's KV (its prompts alone, cache off), the others with the plain baseline's."""
    out = {}
    for sec in [s for s in sections if load_column.is_load(s)]:
        mine = {run: results.pop(run) for run in sec["run_names"].values() if run in results}
        out[sec["name"]] = _audit(study, sec["reference_result"], [sec], mine, f"kv-compare-{sec['name']}")
    plain_ones = [s for s in sections if not load_column.is_load(s)]
    return _audit(study, baseline, plain_ones, results, "kv-compare-scenarios") | out


def _audit(study: Study, reference: ArmResult | None, sections: list[dict], results: dict, folder: str) -> dict:
    t0 = time.monotonic()
    raw, problem = None, None
    if reference is None or reference.kv_audit is None:
        problem = "the baseline recorded no reference KV"
    elif results:
        print(f"[kvkit] detection-scenarios KV audit ({folder}): {len(results)} runs ...", file=sys.stderr, flush=True)
        work = study.runner.work / folder
        work.mkdir(parents=True, exist_ok=True)
        job = machinery.compare_job(reference, results)
        raw, problem = run_compare(job, work, study.runner.env, sys.executable, study.runner.timeout_s)
    for sec in sections:
        for entry in sec["arms"]:
            name = sec["run_names"].get(entry["arm"])
            machinery.annotate_kv(entry, results.get(name), raw, problem, plan.BLOCK_SIZE)
    return {"runs": sorted(results), "problem": problem, "wall_s": round(time.monotonic() - t0, 1)}


def _arm_summary(entry: dict) -> dict:
    keep = ("verdict", "reasons", "class", "preemptions", "preemptions_source", "wall_s", "timing")
    return {k: entry.get(k) for k in keep} | {"kv": (entry.get("kv") or {}).get("verdict")}


def cells_of(plain_rows: dict, plain_controls: dict, sections: list[dict]) -> tuple[list[dict], list[dict]]:
    """Every (row, column) cell and every (control, column) entry, from the plain column's entries and the
    scenario sections (each cell keeps its requests' records)."""
    cells, controls = [], []
    for row, _, params in ROWS:
        entry, result = plain_rows[row]
        recs = plain_records(entry, result)
        error = None if entry["error"] is None else f"{entry['error']['kind']}: {entry['error']['detail']}"
        cell = fault_cell(recs, HYPOTHESIS[row][PLAIN], error)
        cells.append({"row": row, "column": PLAIN, **cell, "arm": None, "requests": recs})
    for name in CONTROLS:
        entry, result = plain_controls[name]
        error = None if entry["error"] is None else f"{entry['error']['kind']}: {entry['error']['detail']}"
        controls.append({"arm": name, "column": PLAIN, **control_cell(plain_records(entry, result), error)})
    for sec in sections:
        by_arm = {e["arm"]: e for e in sec["arms"]}
        wants_preemption = bool(sec["engine"].get("preemption"))
        for row, _, _ in ROWS:
            entry = by_arm[row]
            recs, rest = (
                (load_column.cell_records(entry)) if load_column.is_load(sec) else (scenario_records(entry), None)
            )
            error = _arm_error(entry, sec)
            missing = wants_preemption and not entry.get("preemptions")
            cell = fault_cell(recs, HYPOTHESIS[row][sec["name"]], error, missing and error is None, left_out=rest)
            cell |= {"arm": _arm_summary(entry), "requests": recs} | ({"records_left_out": rest} if rest else {})
            cells.append({"row": row, "column": sec["name"], **cell})
        for name in CONTROLS:
            entry = by_arm[name]
            ctl = control_cell(scenario_records(entry), _arm_error(entry, sec))
            controls.append({"arm": name, "column": sec["name"], **ctl, "verdict": entry["verdict"]})
    return cells, controls


def _arm_error(entry: dict, sec: dict) -> str | None:
    """Why a scenario arm could not be judged (it failed, had no baseline or no control), else None."""
    if entry.get("error"):
        return f"{entry['error']['kind']}: {entry['error']['detail']}"
    if sec["control"]["status"] != "ok":
        return f"the schedule control failed: {sec['control']['error']}"
    if not entry.get("requests"):
        return "; ".join(entry.get("reasons") or ["no request was judged"])
    return None


def build_report(
    cells: list[dict],
    controls: list[dict],
    sections: list[dict],
    kv: dict,
    models: dict,
    walls: list[dict],
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
            **run_settings(),
            "prompts": [list(p) for p in plan.PROMPTS],
            "decoy": list(plan.DECOY),
            "model_seed": MODEL_SEED,
            "models": {str(s): {"sha256": sha} for s, (_, sha) in sorted(models.items())},
            "fault": {"fault": FAULT, "position": POSITION, **plan.FAULT_PARAMS[FAULT]},
            "rows": [
                {"row": name, "plants": what, "fault": row_fault(name), "params": row_params(name)}
                for name, what, _ in ROWS
            ],
            "controls": list(CONTROLS),
            "columns": [{"column": PLAIN, "description": "the decoy, then each prompt cold and once reused"}]
            + [
                {"column": s["name"], "description": s["description"], "engine": s["engine"]}
                | ({"load": s["load"]} if load_column.is_load(s) else {"steps": s["steps"]})
                for s in sections
            ],
            "hypothesis": HYPOTHESIS,
            "kv_audit": True,
        },
        "cells": cells,
        "controls": controls,
        "schedule_controls": {
            s["name"]: {
                k: s["control"].get(k) for k in ("status", "error", "preemptions", "preemptions_source", "wall_s")
            }
            | {
                "differs_from_plain": [
                    f"step {r['step']} {r['probe']}" for r in s["control"]["requests"] if not r["matches_plain"]
                ]
            }
            for s in sections
        },
        "kv_audit": kv,
        "sections": [load_column.slim(s) if load_column.is_load(s) else _slim(s) for s in sections],
        # Diagnostics only (how long the study takes here), never a performance claim.
        "diagnostics": {"wall_s": round(wall_s, 1), "arms": walls},
        "provenance": provenance(argv, env, started),
    }


def run_scenario_study(
    report_path: Path, models_dir: Path, timeout_s: float, argv: list[str], columns: tuple[str, ...] = COLUMNS
) -> dict:
    """Run the plain column, then each scenario column asked for, audit their KV, write the report atomically
    and return it."""
    started, t0 = utc_now(), time.monotonic()
    models = prepare_models(models_dir, (MODEL_SEED,))
    model = models[MODEL_SEED][0]
    engine = plan.engine_config(str(Path(model).resolve()))
    report_path.parent.mkdir(parents=True, exist_ok=True)
    env = child_env(dict(os.environ), hashseed="0", extra={})
    work = Path(tempfile.mkdtemp(prefix=".detection-scenarios.work-", dir=report_path.parent))
    try:
        study = Study(Runner(work=work, env=env, timeout_s=timeout_s), engine)
        base_out = study.run(plan.baseline_job(work, MODEL_SEED, model))
        baseline = None if base_out.failure else base_out.result
        base_json = None if baseline is None else baseline.to_json()
        plain_rows, plain_controls, audited = run_plain(study, model, base_json)
        sections, results = [], {}
        for sc in SCENARIOS:
            if sc.name in columns:
                sec, res = run_column(study, sc, baseline)
                sections.append(sec)
                results.update(res)
        kv = {"plain": audit_seed(study.runner, MODEL_SEED, base_json, audited)}
        kv["scenarios"] = audit_columns(study, baseline, sections, results)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    cells, controls = cells_of(plain_rows, plain_controls, sections)
    for sec in sections:
        sec.pop("run_names", None)
        sec.pop("reference_result", None)
    report = build_report(cells, controls, sections, kv, models, study.walls, argv, env, started, time.monotonic() - t0)
    write_json_atomic(report_path, report)
    return report


def _slim(section: dict) -> dict:
    """A scenario section as the report keeps it: everything but the token IDs and texts (the cells' records
    keep what decides them; the IDs of every request would multiply the file's size)."""
    out = dict(section, control=dict(section["control"]))
    out["control"]["requests"] = [
        {k: v for k, v in r.items() if k != "token_ids"} for r in section["control"]["requests"]
    ]
    out["arms"] = [
        dict(
            a,
            requests=[{k: v for k, v in r.items() if k not in ("token_ids", "text", "margin")} for r in a["requests"]],
        )
        for a in section["arms"]
    ]
    return out


def summary(report: dict) -> dict:
    """What the command prints and the exit code reads: the held counts, arm errors, false positives."""
    cells = report["cells"]
    top = str(max(report["config"]["windows"]))
    return {
        "cells": len(cells),
        "held": sum(c["held"] is True for c in cells),
        "did_not_hold": [
            f"{c['row']} x {c['column']}: expected {c['hypothesis']}, {c['status']}"
            for c in cells
            if c["held"] is False
        ],
        "undecided": [f"{c['row']} x {c['column']}: {c['status']}" for c in cells if c["held"] is None],
        "errors": [f"{c['row']} x {c['column']}: {c['error']}" for c in cells if c["error"]]
        + [f"{c['arm']} x {c['column']}: {c['error']}" for c in report["controls"] if c["error"]],
        "false_positives": sum(c["false_positives_by_window"][top] for c in report["controls"]),
        "false_blames": sum(len(c["false_blames"]) for c in report["controls"]),
    }
