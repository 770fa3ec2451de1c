"""The scenarios a run asked for (--scenarios), after the plain arms: each (scenario, arm) one child in a fresh
engine with the scenario's settings, run by the scheduler like the arms, with --trials N each (scenario, reuse
arm) N times (the schedule control once); then the KV audit of their requests and the report's sections
(repro.run.scenarios judges each run, repro.judge.trials reduces the trials)."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from repro.contract.job import Job
from repro.contract.result import ArmResult
from repro.judge import trials
from repro.plan.arms import arm_slots
from repro.plan.run_plan import RunPlan
from repro.run import load_scenario, scenarios
from repro.run.clock import Clock
from repro.run.kvaudit import run_compare
from repro.run.launch import run_arms
from repro.run.progress import Progress
from repro.run.scheduler import SlotPool
from repro.run.workspace import Workspace


class ScenarioRuns:
    """The scenario runs of one run (module docstring): `sections` for the report, `names` of their logs."""

    def __init__(self, plan: RunPlan, ws: Workspace) -> None:
        self.engine, self.children, self.audit = plan.engine, plan.children, plan.kv_audit
        self.n_trials, self.lmcache_config = plan.repeats.trials, plan.lmcache.config
        self.fixture, self.probes, self.arms = plan.inputs.fixture, list(plan.inputs.probes), ws.arms
        self.work, self.env, self.scratch, self.scratch_root = ws.work, ws.env, ws.scratch, ws.scratch_root
        self.logs_rel = ws.logs_rel
        self.sections: list[dict] = []
        self.names: list[str] = []
        self.trial_errors: list[dict] = []
        self.wall_s = 0.0  # the scenario stage's, for the report's diagnostics

    def run(self, chosen, baseline: ArmResult | None, n_jobs: int, progress: Progress, clock: Clock) -> None:
        todo = []  # (scenario, original arm, its renamed run, trial)
        skipped: dict[str, dict[str, tuple[str, str]]] = {}  # scenario -> arm -> (mode, why)
        for sc in chosen:
            runs, skipped[sc.name] = scenarios.runs_of(sc, self.arms)
            todo += [(sc, original, run, 1) for original, run in runs]
        # trials 2..N after every first run, each a fresh engine (and store); the controls run once
        todo += [
            (sc, original, scenarios.trial_run(run, k), k)
            for sc, original, run, _ in list(todo)
            if original.spec.mode != "baseline" and not load_scenario.is_control(run.name)
            for k in range(2, self.n_trials + 1)
        ]
        plan = []  # (scenario, original arm, run arm, derived LMCache YAML record, trial)
        for sc, original, run, k in todo:
            run, record = scenarios.prepare(run, sc, self.work, self.scratch, self.scratch_root, self.lmcache_config)
            plan.append((sc, original, run, record, k))
        self.names = [run.name for _, _, run, _, _ in plan]
        progress.note(f"scenarios: {len(plan)} runs ({', '.join(sc.name for sc in chosen)})")

        def job_for(i: int, dependency=None) -> Job:
            sc, _, run, _, _ = plan[i]
            kv_dir = str(self.work / "kv" / run.name) if self.audit.enabled else None
            return scenarios.job_for(self.engine, run, sc, self.probes, self.fixture.sha256, kv_dir)

        servers = {run.name: scenarios.mp_settings(sc) for sc, _, run, _, _ in plan}
        slots = SlotPool(arm_slots(self.engine, len(plan), n_jobs))
        outcomes = run_arms([p[2] for p in plan], job_for, slots, n_jobs, self.work, self.env, self.children, progress,
                            clock, servers)  # fmt: skip
        results = {
            run.name: o.result
            for (_, original, run, _, _), o in zip(plan, outcomes)
            if o is not None
            and o.failure is None
            and o.result is not None
            and original.spec.mode != "baseline"
            and not load_scenario.is_reference(run.name)
        }  # fmt: skip (a load scenario's reuse control is KV-compared too: what native reuse does to the bytes there)
        # the KV audit's comparisons: one against the plain baseline's KV for the scenarios over the fixture's probes,
        # one per load scenario against its own reference (its baseline's child answered every prompt alone)
        audits: dict[str, tuple[dict | None, str | None]] = {}
        groups: dict[str, tuple[ArmResult | None, dict]] = {"": (baseline, {})}
        for (sc, _, run, _, _), out in zip(plan, outcomes):
            if load_scenario.is_reference(run.name):
                groups[sc.name] = (load_scenario.reference(out), {})
        for sc, _, run, _, _ in plan:
            if run.name in results:
                groups["" if sc.load is None else sc.name][1][run.name] = results[run.name]
        for key, (reference, group) in groups.items():
            raw, problem = None, None
            if self.audit.enabled and group:
                if reference is None or reference.kv_audit is None:
                    problem = "the baseline recorded no reference KV"
                else:
                    progress.note(f"scenarios: comparing KV{f' ({key})' if key else ''}")
                    job = scenarios.compare_job(reference, group)
                    python = self.children.compare_python or self.children.python  # as the plain arms' (kvaudit)
                    raw, problem = run_compare(job, self.work, self.env, python, self.children.timeout_s)
            audits[key] = (raw, problem)
        # the scenario runs' tensors too (the arms' went before)
        if self.audit.enabled and results and self.audit.keep_dir and (self.work / "kv").exists():
            shutil.copytree(self.work / "kv", Path(self.audit.keep_dir), dirs_exist_ok=True)
        for sc in chosen:
            raw, problem = audits.get("" if sc.load is None else sc.name, (None, None))
            runs = [(o, run, out, rec) for (s, o, run, rec, k), out in zip(plan, outcomes) if s is sc and k == 1]
            sec = scenarios.section(sc, runs, skipped[sc.name], baseline, self.logs_rel)
            judging = scenarios.judging_baseline(sc, runs, baseline, self.logs_rel)  # for the trials and reuse control
            if sc.load is not None:  # the reuse control's own KV verdict, beside the arms'
                reuse = next(((run, out) for _, run, out, _ in runs if load_scenario.is_reuse_control(run.name)), None)
                if reuse is not None:
                    judged = scenarios.judge_run(sc, reuse[0], reuse[1], judging[0], sec["control"], self.logs_rel)
                    scenarios.annotate_kv(judged, results.get(reuse[0].name), raw, problem, self.engine.block_size)
                    sec["load"]["reuse_control"]["kv"] = load_scenario.kv_summary(judged)
            by_arm = {o_arm.name: run.name for o_arm, run, _, _ in runs if not load_scenario.is_control(run.name)}
            verdicts = {by_arm.get("baseline"): "control " + sec["control"]["status"]}
            for _, run, out, _ in runs:
                if load_scenario.is_reference(run.name):
                    verdicts[run.name] = "reference " + ("ok" if load_scenario.reference(out) else "error")
                elif load_scenario.is_reuse_control(run.name):
                    verdicts[run.name] = "control " + sec["load"]["reuse_control"]["status"]
            for entry in sec["arms"]:
                name = by_arm.get(entry["arm"])
                scenarios.annotate_kv(entry, results.get(name), raw, problem, self.engine.block_size)
                verdicts[name] = entry["verdict"]
                if self.n_trials > 1 and name is not None:
                    more = [(run, out, k) for (s, o_arm, run, _, k), out in zip(plan, outcomes)
                            if s is sc and k > 1 and o_arm.name == entry["arm"]]  # fmt: skip
                    verdicts |= self._trials(sc, entry, name, more, judging, sec["control"], (results, raw, problem),
                                             clock)  # fmt: skip
            for name, verdict in verdicts.items():
                if name is not None and name in progress.arms:
                    progress.finish(name, verdict)
            self.sections.append(sec)

    def _trials(self, sc, entry: dict, name: str, more, judging, control, audit, clock: Clock) -> dict[str, str]:
        """Trials 2..N of one (scenario, arm), each judged and audited exactly as its own run was, reduced to
        the entry's `trials` (repro.judge.trials; its verdict stays its own run's). Returns each trial's verdict."""
        results, raw, problem = audit
        shared = (clock.sharing(name) or {}).get("shared")
        runs = [trials.scenario_run_summary(entry, 1, shared)]
        verdicts = {}
        for run, outcome, k in more:
            judged = scenarios.judge_run(sc, run, outcome, judging[0], control, self.logs_rel, judging[1])
            scenarios.annotate_kv(judged, results.get(run.name), raw, problem, self.engine.block_size)
            runs.append(trials.scenario_run_summary(judged, k, (clock.sharing(run.name) or {}).get("shared")))
            verdicts[run.name] = judged["verdict"]
            if judged["error"]:
                self.trial_errors.append({"arm": f"{entry['arm']} (scenario {sc.name}, trial {k})",
                                          **{key: judged["error"][key] for key in ("kind", "detail")}})  # fmt: skip
        entry["trials"] = trials.scenario_trial_rates(runs)
        return verdicts

    def errors(self) -> list[dict]:
        out = []
        for sec in self.sections:
            ctl = sec["control"]
            if ctl["status"] == "error":
                kind, _, detail = ctl["error"].partition(": ")
                out.append({"arm": f"baseline (scenario {sec['name']})", "kind": kind, "detail": detail})
            for which in ("reference", "reuse_control"):  # a load scenario's
                got = (sec.get("load") or {}).get(which)
                if got and got["status"] == "error":
                    kind, _, detail = got["error"].partition(": ")
                    out.append({"arm": f"{which.replace('_', ' ')} (scenario {sec['name']})", "kind": kind,
                                "detail": detail})  # fmt: skip
            for e in sec["arms"]:
                if e["error"]:
                    out.append({"arm": f"{e['arm']} (scenario {sec['name']})", "kind": e["error"]["kind"],
                                "detail": e["error"]["detail"]})  # fmt: skip
        return out + self.trial_errors


def run_scenarios(plan: RunPlan, ws: Workspace, baseline: ArmResult | None, progress: Progress) -> ScenarioRuns | None:
    """The scenarios' runs after the plain arms (None when --scenarios asked for none)."""
    if not plan.inputs.scenarios:
        return None
    ran = ScenarioRuns(plan, ws)
    t = time.monotonic()
    ran.run(list(plan.inputs.scenarios), baseline, plan.jobs, progress, ws.clock)
    ran.wall_s = time.monotonic() - t
    return ran
