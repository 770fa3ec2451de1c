"""A run's report, assembled from its plan and what its stages left: the arms' judged entries, the scenarios'
sections, the conditions it ran under (trials, confirmation, LMCache's copy path, the load neighbour), its
provenance and its diagnostics. The settings it records come from the plan (repro.plan.run_plan), never from
the options; what ran comes from the run's objects, read as documented below (no import of the run side)."""

from __future__ import annotations

from repro import __version__
from repro.plan.adapters import describe as describe_adapters
from repro.plan.images import describe as describe_images
from repro.plan.run_plan import RunPlan
from repro.plan.settings import HASHSEED
from repro.record.acceptance import check_acceptance, check_scenario_acceptance, check_upstream
from repro.record.provenance import collect_provenance, hardware_label, utc_now
from repro.record.report import REPORT_KIND, REPORT_SCHEMA_VERSION, generations


def assemble(plan: RunPlan, ws, entries: list[dict], ran, scen=None) -> dict:
    """The whole report. ws: the run's workspace (repro.run.workspace.Workspace: its children's env, when it
    started, its wall clock, LMCache's copy paths); ran: the arms' runs (repro.run.arm_runs.ArmRuns: the runs
    beyond each arm's own, the stages' walls, the load neighbour's record); scen: the scenario runs
    (repro.run.scenario_runs.ScenarioRuns), None when none were asked for."""
    report = base_report(plan, entries, ws.env, ws.started, ws.wall_s())
    if scen is not None:
        expected_kv = plan.inputs.fixture.expected_scenarios_kv if plan.kv_audit.enabled else None
        report["config"]["scenarios"] = [sc.name for sc in plan.inputs.scenarios]
        report["scenarios"] = scen.sections
        report["errors"] += scen.errors()
        report["acceptance"]["scenarios"] = check_scenario_acceptance(
            scen.sections, plan.inputs.fixture.expected_scenarios, plan.inputs.suite, expected_kv
        )
    fixture = plan.inputs.fixture
    if fixture.upstream:  # the expectations bound to an upstream bug, on the engine's versions as its baseline recorded
        versions = report["provenance"].get("engine_versions")
        sections = scen.sections if scen is not None else None
        report["upstream"] = check_upstream(fixture.upstream, entries, sections, versions, plan.kv_audit.enabled)
    report["conditions"] = {
        "trials": plan.repeats.trials,
        "confirm": plan.repeats.confirm,
        "lmcache_ops": plan.lmcache.ops,
        "gpu_load": ran.load_record if plan.loads.gpu else None,
        "cpu_load": ran.load_record if plan.loads.cpu and not plan.loads.gpu else None,
    }
    if plan.inputs.adapters is not None:  # the LoRA adapters probes ran under: how each was sent, its weights' digest
        report["adapters"] = describe_adapters(plan.inputs.adapters, plan.inputs.probes)
    if any(p.image is not None for p in plan.inputs.probes):  # each image: its seed, identifier and 16 bits
        report["images"] = describe_images(plan.inputs.probes)
    if ws.ops is not None:
        report["provenance"]["lmcache_ops"] = ws.ops.provenance
    if ws.arms_ops:
        report["provenance"]["lmcache_ops_arms"] = ws.arms_ops
    report["errors"] += run_errors(ran)
    walls = {**ran.walls, **({"scenarios": scen.wall_s} if scen is not None else {})}
    report["diagnostics"].update({f"{k}_wall_s": round(v, 3) for k, v in walls.items()})
    return report


def run_errors(ran) -> list[dict]:
    """The report's errors of the runs beyond each arm's own (a trial, a run alone), named after their arm."""
    return [
        {"arm": f"{ran.planned[r.primary].name} ({r.label})", "kind": r.entry["error"]["kind"],
         "detail": r.entry["error"]["detail"]}
        for r in ran.runs
        if r.entry is not None and r.entry.get("error")
    ]  # fmt: skip


def base_report(plan: RunPlan, entries: list[dict], env: dict, started: str, wall_s: float) -> dict:
    """The report of the arms' own entries: config, acceptance, warnings and errors, provenance, diagnostics."""
    engine, inputs, fixture = plan.engine, plan.inputs, plan.inputs.fixture
    prov = collect_provenance(
        argv=list(plan.argv),
        env=env,
        started=started,
        fixture_path=inputs.fixture_path,
        fixture_sha256=fixture.sha256,
        model=engine.model,
        lmcache_config=plan.lmcache.config,
        python=plan.children.python,
    )
    prov["ended_utc"] = utc_now()
    prov["pythonhashseed"] = HASHSEED
    base = next((e for e in entries if e["mode"] == "baseline"), None)
    if base and base.get("versions"):
        prov["engine_versions"] = base["versions"]
    errors = [{"arm": e["name"], **{k: e["error"][k] for k in ("kind", "detail")}} for e in entries if e["error"]]
    warnings = [{"arm": e["name"], "message": m, "count": c} for e in entries for m, c in e["warnings"].items()]
    starts = [e["timing"].get("engine_start_s") for e in entries if e["timing"].get("engine_start_s") is not None]
    expected_kv = fixture.expected_kv if plan.kv_audit.enabled else None
    return {
        "kind": REPORT_KIND,
        "schema_version": REPORT_SCHEMA_VERSION,
        "tool_version": __version__,
        "claim_eligible": False,
        "complete": True,
        "fixture": {"name": fixture.name, "tokenizer": fixture.tokenizer, "sha256": fixture.sha256},
        "config": config_block(plan),
        "arms": entries,
        "generations": generations(entries),
        "acceptance": check_acceptance(entries, fixture.expected, inputs.suite, expected_kv),
        "warnings": warnings,
        "errors": errors,
        "hardware_label": hardware_label(prov["hardware"]),
        "provenance": prov,
        # Diagnostics only, for `make bench`: never a performance claim (claim_eligible is false).
        "diagnostics": {"wall_s": round(wall_s, 3), "engine_start_s_sum": round(sum(starts), 3)},
    }


def config_block(plan: RunPlan) -> dict:
    """The report's `config`: the settings every arm ran with, as the command line gave them."""
    engine, asked = plan.engine, plan.asked
    return {
        "model": engine.model,
        "model_revision": engine.revision,
        "dtype": engine.dtype,
        "block_size": engine.block_size,
        **({"block_size_chosen": engine.block_size_chosen} if engine.block_size_chosen else {}),  # --block-size auto
        "max_tokens": engine.max_tokens,
        "max_model_len": engine.max_model_len,
        "seed": engine.seed,
        "gpu_memory_utilization": engine.gpu_memory_utilization,
        **({"kv_cache_tokens": engine.kv_cache_tokens} if engine.kv_cache_tokens else {}),  # --kv-cache-tokens
        "device": engine.device,
        **({"speculative_config": engine.speculative_config} if engine.speculative_config else {}),
        "suite": plan.inputs.suite,
        "compare_native": asked.compare_native,
        "reuses": plan.inputs.reuses,
        "logprobs": engine.logprobs,
        "kv_connector": asked.kv_connector,
        "kv_connector_module_path": asked.module_path,
        "lmcache_config": plan.lmcache.config,
        "kv_audit": plan.kv_audit.enabled,
        "keep_kv": plan.kv_audit.keep_dir,
        "batch_invariant": engine.batch_invariant,
        "frontend": engine.frontend,
        "engine_layout": engine.engine_layout,
        "jobs": min(plan.jobs, len(plan.arms)),
        "decoding": "greedy, ignore_eos, enforce_eager",
    }
