"""The verification run: arms planned from flags and fixture, children run, report written."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass, replace
from pathlib import Path

from repro import __version__
from repro.commands import run_command, say_error
from repro.contract import ArmResult, Failure, Job
from repro.errors import EXIT_INTERRUPTED, EXIT_RUNTIME, UsageError
from repro.judge import kvaudit, trials
from repro.judge.evaluate import judge_arm
from repro.judge.verdict import (
    BATCH_INVARIANT_INACTIVE,
    LMCACHE_DEGRADED,
    batch_invariance_state,
    decide_batch_invariance,
    decide_child_failure,
    decide_lmcache_degraded,
)
from repro.lmcache import mp as lmcache_mp
from repro.lmcache import ops as lmcache_ops
from repro.lmcache.signals import lmcache_evidence
from repro.plan.arms import (
    LMCACHE_CONFIG_ENV,
    ArmSlot,
    PlannedArm,
    arm_job,
    arm_slots,
    default_jobs,
    matched_probes,
    materialize,
    plan_arms,
    preflight_for,
    vocab_size,
)
from repro.plan.devices import uses_cuda, visible_gpus
from repro.plan.fixtures import Fixture, check_probes_fit, load_fixture
from repro.plan.options import FRONTEND_ENV, Options, parse_args
from repro.plan.suite import build_probes
from repro.publish.summary import format_summary
from repro.record import atomic
from repro.record.atomic import dumps_json, write_bytes_atomic
from repro.record.provenance import collect_provenance, hardware_label, utc_now
from repro.record.report import (
    REPORT_KIND,
    REPORT_SCHEMA_VERSION,
    check_acceptance,
    check_scenario_acceptance,
    exit_code,
    generations,
    validate_report,
)
from repro.run import cpu_load, gpu_load, logscan, scenarios, scheduler, workdir
from repro.run.diskwatch import DiskLimits
from repro.run.neighbour import LoadError
from repro.run.progress import Progress, choose_mode
from repro.run.runner import (
    INTERRUPTED,
    ArmOutcome,
    Interrupted,
    child_env,
    deferred_signals,
    run_arm,
)
from repro.run.scheduler import SlotPool
from repro.run.sharing import ARM, CPU_CORES, CPU_LOAD, GPU_LOAD, SERVER, Window, gpu_resource, sharing_of, who_shared

HASHSEED = "0"
# A confirmation's reason when the run alone could read what the shared run stored (repro.plan.arms's `store`).
STORE_PERSISTED = "the store persisted: not independent"


@dataclass
class RunState:
    """What the run has done so far, so that an interrupt or a crash is reported truthfully."""

    report_path: Path | None = None
    published: dict | None = None  # the report, once it and its logs are on disk


def arm_entry(
    arm: PlannedArm,
    outcome: ArmOutcome,
    baseline: ArmResult | None,
    block_size: int,
    logs_rel: str,
    batch_invariant: bool = False,
) -> dict:
    """One arm of the report: its result judged against the baseline, or its failure."""
    spec = arm.spec
    # the log the outcome came from: the arm's, or its MP server's when the arm never ran (never one not written)
    log = outcome.log_path.name if outcome.log_path is not None else f"{spec.name}.log"
    entry = {
        "name": spec.name,
        "mode": spec.mode,
        "connector": spec.connector and spec.connector.to_json(),
        "error": None,
        "log": f"{logs_rel}/{log}",
        "warnings": logscan.count_warnings(outcome.log_text),
        "effective_config": None,
        "versions": None,
        "probes": [],
        "findings": [],
        "timing": {"wall_s": outcome.wall_s},
    }
    if arm.store is not None:  # how this run's connector state was made fresh, or why it may persist (repro.plan.arms)
        entry["store"] = arm.store
    res = outcome.result
    if res is not None:
        entry.update(effective_config=res.effective_config, versions=res.versions)
        entry["timing"].update(engine_start_s=res.engine_start_s, import_s=res.import_s, generation_s=res.generation_s)
    if outcome.failure is not None:
        verdict = decide_child_failure(outcome.failure.kind, outcome.failure.detail)
        entry.update(error=outcome.failure.to_json(), verdict=verdict.verdict, reasons=list(verdict.reasons))
        return entry
    probes, verdict = judge_arm(res, baseline, spec.mode, block_size, arm.skip_probes, outcome.asked)
    entry["probes"] = probes
    if spec.connector is not None and "lmcache" in spec.connector.name.lower():
        evidence = lmcache_evidence(
            probes,
            outcome.log_text,
            connector=spec.connector.name,
            server_log=lmcache_mp.server_log_path(Path(logs_rel), spec.name).as_posix(),
            engine_build=(res.versions or {}).get("lmcache_build"),
            server_copy_path=outcome.server_copy_path,
        )
        entry["lmcache"] = evidence.signals
        entry["copy_paths"] = evidence.signals.get("copy_paths")  # every LMCache process: compiled or fallback
        entry["findings"] += list(evidence.findings)
        for probe in probes:
            for i, req in enumerate(probe["requests"]):
                req["lmcache"] = evidence.request_views[(probe["name"], i)]
        verdict = decide_lmcache_degraded(verdict, evidence.degraded)
        if verdict.error_kind == LMCACHE_DEGRADED:
            entry["error"] = Failure(verdict.error_kind, verdict.error_detail, "\n".join(evidence.degraded)).to_json()
    # --batch-invariant: an arm whose workers did not confirm the kernels were active is no evidence
    cfg = res.effective_config or {}
    verdict = decide_batch_invariance(verdict, batch_invariant, batch_invariance_state(cfg.get("workers")))
    if verdict.error_kind == BATCH_INVARIANT_INACTIVE:
        entry["error"] = Failure(verdict.error_kind, verdict.error_detail).to_json()
    entry.update(verdict=verdict.verdict, reasons=list(verdict.reasons))
    return entry


def run(opts: Options, argv: list[str], state: RunState) -> int:
    a = opts.args
    fixture = load_fixture(a.fixture)
    probes = build_probes(fixture.probes, a.suite)
    check_probes_fit(
        probes,
        vocab_size=vocab_size(opts),
        max_model_len=a.max_model_len,
        max_tokens=a.max_tokens,
        where=f"fixture {a.fixture}",
    )
    chosen = scenarios.select(fixture, a.scenarios, probes, a.max_model_len)
    arms = plan_arms(opts, fixture)
    preflight = preflight_for(opts, arms)
    report_path = state.report_path = Path(a.report)
    report_path.parent.mkdir(parents=True, exist_ok=True)
    started = utc_now()
    extra_env = {
        "LMCACHE_LOG_LEVEL": os.environ.get("LMCACHE_LOG_LEVEL", "INFO"),  # its hit lines are INFO
        # the flag decides, not whatever the caller's environment holds; every worker reports what it ran
        "VLLM_BATCH_INVARIANT": "1" if a.batch_invariant else "0",
        FRONTEND_ENV: a.frontend,  # the engine child's front end (repro.engine.frontend); the flag decides
    }
    if a.lmcache_config:
        extra_env[LMCACHE_CONFIG_ENV] = str(Path(a.lmcache_config).resolve())
    env = child_env(dict(os.environ), hashseed=HASHSEED, extra=extra_env)
    arms, arms_ops = own_copy_paths(arms, a.python, env)
    ops = None
    if any(scenarios.is_lmcache(arm) for arm in arms):
        ops = lmcache_ops.resolve(a.lmcache_ops, a.python, env)  # compiled ops or the fallback, for every process
        env = lmcache_ops.apply(ops, env)
    said = workdir.sweep_line(workdir.sweep_stale(report_path.parent))  # what kill -9 left of earlier runs
    if said:
        print(said, file=sys.stderr, flush=True)
    work, scratch_root = workdir.make_work_dir(report_path)  # its owner recorded, for the next run's sweep
    logs_dir_name = f"{report_path.stem}.logs"
    scratch: list[str] = []
    entries: list[dict] = []
    results: dict[str, ArmResult] = {}
    t0 = time.monotonic()
    n_jobs = a.jobs or default_jobs(opts, len(arms))
    pool = SlotPool(arm_slots(opts, len(arms), n_jobs))
    progress = Progress([p.name for p in arms], choose_mode(a.quiet))
    try:
        with progress:
            planned = [materialize(p, scratch, scratch_root) for p in arms]
            matched: dict[str, tuple[dict, dict]] = {}  # native-matched arm -> (skipped, what it matched)

            def job_for(i: int, dependency: ArmOutcome | None = None, arm: PlannedArm | None = None) -> Job:
                """Arm i's job (run_arms gives it the engine settings of the slot it takes); a trial or
                a confirmation run passes its own (renamed, freshly materialized) arm, and never makes
                the preflight."""
                own = arm is None
                arm = arm or planned[i]
                kv_dir = str(work / "kv" / arm.name) if a.kv_audit else None
                job = arm_job(opts, arm, probes, fixture.sha256, preflight if i == 0 and own else None, kv_dir)
                if planned[i].match_arm is not None:
                    conn = dependency.result if dependency is not None and dependency.failure is None else None
                    probe_jobs, skipped, info = matched_probes(opts, planned[i], probes, conn, a.block_size)
                    if own:
                        matched[arm.name] = (skipped, info)
                    job = replace(job, probes=tuple(probe_jobs))
                return job

            progress.note(f"{len(planned)} arms, {min(n_jobs, len(planned))} at a time")
            clock = Clock(t0, resource_for(opts))
            with load_neighbour(opts, env, work, clock) as load:
                outcomes = run_arms(planned, job_for, pool, n_jobs, work, env, a, progress, clock)
                arms_wall = clock.now()
                for i, arm in enumerate(planned):
                    if arm.name in matched:
                        planned[i] = replace(arm, skip_probes={**arm.skip_probes, **matched[arm.name][0]})
                first = outcomes[0]
                if first is not None and first.result is not None and first.result.preflight_problems:
                    raise UsageError("; ".join(first.result.preflight_problems))
                baseline = None
                for arm, outcome in zip(planned, outcomes):
                    if arm.spec.mode == "baseline" and outcome.failure is None:
                        baseline = outcome.result
                    if outcome.result is not None and outcome.failure is None:
                        results[arm.name] = outcome.result
                    entries.append(arm_entry(arm, outcome, baseline, a.block_size, logs_dir_name, a.batch_invariant))
                    if arm.match_arm is not None:
                        info = matched.get(arm.name, ({}, {}))[1]
                        entries[-1]["matched_to"] = arm.match_arm
                        for p in entries[-1]["probes"]:
                            p["match"] = info.get(p["name"])
                slots = [pool.taken.get(arm.name) for arm in planned]  # where each ran
                extra = Extra(opts, arms, planned, outcomes, slots, job_for, baseline, logs_dir_name, scratch,
                              scratch_root)  # fmt: skip
                extra.walls["arms"] = arms_wall
                if a.trials > 1:
                    progress.note(f"trials 2 to {a.trials} of every reuse arm")
                    run_trials(extra, a.trials, n_jobs, work, env, a, progress, clock)
            # recorded once it is stopped: its end, how it ended and its last counters
            load_record = load.record() if load is not None else None
            load_name = load.kind.name if load is not None else None
            audit_all(entries + extra.entries, results | extra.results, baseline, work, env, a, progress)
            confirm = confirmations(entries, extra, clock, a)
            if confirm:
                run_confirmations(extra, confirm, work, env, a, progress, clock)
                audit_all(extra.alone_entries(), extra.results, baseline, work, env, a, progress)
            fold_runs(entries, extra, clock, a)
            for e in entries:
                progress.finish(e["name"], e["verdict"])
            ran = ScenarioRuns(opts, fixture, probes, arms, work, env, scratch, scratch_root, logs_dir_name)
            if chosen:
                t = time.monotonic()
                ran.run(chosen, baseline, n_jobs, progress, clock)
                extra.walls["scenarios"] = time.monotonic() - t
        report = assemble(opts, fixture, entries, argv, env, started, time.monotonic() - t0, min(n_jobs, len(arms)))
        if chosen:
            report["config"]["scenarios"] = [sc.name for sc in chosen]
            report["scenarios"] = ran.sections
            report["errors"] += ran.errors()
            report["acceptance"]["scenarios"] = check_scenario_acceptance(
                ran.sections, fixture.expected_scenarios, a.suite, fixture.expected_scenarios_kv if a.kv_audit else None
            )
        report["conditions"] = {
            "trials": a.trials,
            "confirm": a.confirm,
            "lmcache_ops": a.lmcache_ops,
            "gpu_load": load_record if load_name == gpu_load.KIND.name else None,
            "cpu_load": load_record if load_name == cpu_load.KIND.name else None,
        }
        if ops is not None:
            report["provenance"]["lmcache_ops"] = ops.provenance
        if arms_ops:
            report["provenance"]["lmcache_ops_arms"] = arms_ops
        report["errors"] += extra.errors()
        report["diagnostics"].update(extra.timing())
        # Serialize (and check against the schema) before anything on disk changes: a report that
        # cannot be written leaves the old report and its logs as they were.
        validate_report(report)
        data = dumps_json(report).encode("utf-8")
        with deferred_signals():  # logs and report are swapped in together, or not at all
            logs = [e["name"] for e in entries] + extra.names() + ([load_name] if load_name else []) + ran.names
            logs += [server.stem for n in logs if (server := lmcache_mp.server_log_path(work, n)).exists()]
            with publish_logs(work, report_path.parent / logs_dir_name, logs):  # the previous ones back on failure
                write_bytes_atomic(report_path, data)
            state.published = report
    finally:
        # whole or not at all: a signal (a verifier in a matrix cell gets SIGTERM more than once) that cut
        # it short left a work folder without its owner record, which no later run sweeps
        with deferred_signals():
            workdir.remove_work_dir(work, scratch_root)
            for d in scratch:  # under scratch_root: gone with it
                shutil.rmtree(d, ignore_errors=True)
    print(format_summary(report))
    print(f"report: {report_path}", file=sys.stderr)
    return exit_code(report)


class Clock:
    """Seconds since the run's start, and every device-using process's window (repro.run.sharing)."""

    def __init__(self, t0: float, resource_of):
        self.t0 = t0
        self.windows: list[Window] = []
        self._resource_of = resource_of
        self._lock = threading.Lock()

    def now(self) -> float:
        return time.monotonic() - self.t0

    def record(self, process: str, kind: str, owner: str | None, slot, start: float, resources=None) -> None:
        res = tuple(resources) if resources is not None else self._resource_of(slot)
        with self._lock:
            self.windows.append(Window(process, kind, owner, res, start, self.now()))

    def sharing(self, arm: str) -> dict | None:
        with self._lock:
            return sharing_of(arm, list(self.windows))


def resource_for(opts: Options):
    """slot -> the devices an arm in that slot uses: its GPU on CUDA (CUDA_VISIBLE_DEVICES of its
    slot, else the first visible one, which a child that sees them all uses), the cores on the CPU."""
    if not uses_cuda(opts.args.device):
        return lambda slot: (CPU_CORES,)
    first = (visible_gpus() or ["0"])[0]
    return lambda slot: (gpu_resource((slot.env if slot else {}).get("CUDA_VISIBLE_DEVICES", first)),)


def own_copy_paths(arms: list[PlannedArm], python: str, env: dict) -> tuple[list[PlannedArm], dict[str, dict]]:
    """A fixture arm that names its own LMCache copy path (`lmcache_ops`) gets its processes' PYTHONPATH
    for it, in place of --lmcache-ops's; returns the arms and, per such arm, what the path resolved to."""
    plans: dict[str, lmcache_ops.OpsPlan] = {}
    out, provenance = [], {}
    for arm in arms:
        if arm.lmcache_ops is None:
            out.append(arm)
            continue
        if arm.lmcache_ops not in plans:  # an error (compiled ops missing) stops the run at once, exit 2
            plans[arm.lmcache_ops] = lmcache_ops.resolve(arm.lmcache_ops, python, env)
        plan = plans[arm.lmcache_ops]
        own = lmcache_ops.apply(plan, env)
        out.append(replace(arm, env={"PYTHONPATH": own.get("PYTHONPATH", "")}))
        provenance[arm.name] = {"mode": arm.lmcache_ops, **plan.provenance}
    return out, provenance


@contextlib.contextmanager
def load_neighbour(opts: Options, env: dict, work: Path, clock: Clock):
    """--gpu-load: the neighbour keeps every visible GPU busy; --cpu-load: every CPU core the kit may use.
    Either runs while the arms and their trials run and is stopped and reaped on leaving, before any
    confirmation alone; its window is recorded like an arm's, ending at its stop."""
    if opts.args.gpu_load:
        targets = visible_gpus() or ["0"]
        module, kind, resources = gpu_load, GPU_LOAD, [gpu_resource(g) for g in targets]
    elif getattr(opts.args, "cpu_load", False):
        targets, module, kind, resources = cpu_load.cores(), cpu_load, CPU_LOAD, [CPU_CORES]
    else:
        yield None
        return
    start = clock.now()
    try:
        with module.neighbour(opts.args.python, targets, env, module.load_log_path(work), t0=clock.t0) as load:
            yield load
    finally:
        clock.record(kind, kind, None, None, start, resources=resources)


@dataclass
class Run:
    """One more run of a reuse arm: a trial (2..N) or the confirmation alone."""

    primary: int  # index of the arm it repeats
    label: str  # "trial 3", "alone"
    trial: int | None
    arm: PlannedArm  # renamed: <arm>~trial3, <arm>~alone
    slot: ArmSlot | None = None  # the slot it took when it launched, once it ran
    entry: dict | None = None  # judged like an arm (arm_entry), once it ran


class Extra:
    """The runs beyond each arm's own: trials and confirmations, judged like arms, folded into their
    arm's entry at the end (repro.judge.trials)."""

    def __init__(
        self, opts, originals, planned, outcomes, slots, job_for, baseline, logs_rel, scratch, scratch_root=None
    ):
        self.opts = opts
        self.originals, self.planned, self.outcomes, self.slots = originals, planned, outcomes, slots
        self.job_for, self.baseline, self.logs_rel, self.scratch = job_for, baseline, logs_rel, scratch
        self.scratch_root = scratch_root
        self.runs: list[Run] = []
        self.results: dict[str, ArmResult] = {}
        self.walls: dict[str, float] = {}

    def fresh(self, i: int, suffix: str) -> PlannedArm:
        """Arm i again, named <arm>~<suffix>, with connector state of its own (repro.plan.arms.materialize: fresh
        @tmpdir directories, a fresh subfolder of a store directory the user named, LMCache's likewise), so its
        cold request is cold again; its `store` says so, or why its state may persist (a remote server)."""
        arm = self.originals[i]
        arm = replace(arm, spec=replace(arm.spec, name=f"{arm.name}~{suffix}"), match_arm=None)
        return materialize(arm, self.scratch, self.scratch_root)

    def run(
        self, runs: list[Run], slots: list[ArmSlot], n_jobs: int, work: Path, env: dict, a, progress, clock
    ) -> None:
        """These runs, up to n_jobs at a time, each in a free one of these slots when it launches."""
        index = {arm.name: i for i, arm in enumerate(self.planned)}

        def job_for(j: int, dependency=None) -> Job:
            r = runs[j]
            match = self.planned[r.primary].match_arm
            dep = self.outcomes[index[match]] if match is not None else None
            return self.job_for(r.primary, dep, r.arm)

        pool = SlotPool(slots)
        outcomes = run_arms([r.arm for r in runs], job_for, pool, n_jobs, work, env, a, progress, clock)
        for r, outcome in zip(runs, outcomes):
            if outcome is None:
                continue
            r.slot = pool.taken[r.arm.name]
            arm = replace(r.arm, skip_probes={**r.arm.skip_probes, **self.planned[r.primary].skip_probes})
            r.entry = arm_entry(arm, outcome, self.baseline, a.block_size, self.logs_rel, a.batch_invariant)
            if outcome.result is not None and outcome.failure is None:
                self.results[r.arm.name] = outcome.result
            self.runs.append(r)

    def of(self, i: int, alone: bool = False) -> list[Run]:
        return [r for r in self.runs if r.primary == i and (r.trial is None) == alone and r.entry is not None]

    @property
    def entries(self) -> list[dict]:
        return [r.entry for r in self.runs if r.trial is not None and r.entry is not None]

    def alone_entries(self) -> list[dict]:
        return [r.entry for r in self.runs if r.trial is None and r.entry is not None]

    def names(self) -> list[str]:
        return [r.arm.name for r in self.runs]

    def errors(self) -> list[dict]:
        return [
            {"arm": f"{self.planned[r.primary].name} ({r.label})", "kind": r.entry["error"]["kind"],
             "detail": r.entry["error"]["detail"]}
            for r in self.runs
            if r.entry is not None and r.entry.get("error")
        ]  # fmt: skip

    def timing(self) -> dict:
        return {f"{k}_wall_s": round(v, 3) for k, v in self.walls.items()}


def run_trials(extra: Extra, n: int, n_jobs: int, work: Path, env: dict, a, progress: Progress, clock: Clock) -> None:
    """Trials 2..n of every reuse arm, each a fresh engine (and MP server) with connector state of its own
    (Extra.fresh), as many at once as the arms themselves ran, each in a free slot when it launches."""
    todo = [(i, k) for i, arm in enumerate(extra.planned) if arm.spec.mode != "baseline" for k in range(2, n + 1)]
    if not todo:
        return
    slots = arm_slots(extra.opts, len(todo), n_jobs)  # shares for as many at once as --jobs allows
    runs = [Run(i, f"trial {k}", k, extra.fresh(i, f"trial{k}")) for i, k in todo]
    for i in dict.fromkeys(i for i, _ in todo):
        if (persists := _persisting_store(extra.planned[i])) is not None:
            progress.note(f"{extra.planned[i].name}: its trials share a store that persists ({persists})")
    t = time.monotonic()
    extra.run(runs, slots, n_jobs, work, env, a, progress, clock)
    extra.walls["trials"] = time.monotonic() - t


def run_confirmations(extra: Extra, todo: list[tuple[int, Run | None]], work, env, a, progress, clock) -> None:
    """Each shared finding's job again, alone: one at a time, nothing else on the device (no other
    arm, no load neighbour), the same engine settings and device as the run it confirms."""
    t = time.monotonic()
    for i, shared_run in todo:
        slot = shared_run.slot if shared_run is not None else extra.slots[i]  # the one the finding's run took
        progress.note(f"re-running {extra.planned[i].name} alone to confirm its finding")
        slots = [slot] if slot is not None else arm_slots(extra.opts, 1, 1)
        alone = extra.fresh(i, "alone")  # connector state of its own: what the shared run stored is not read
        if (persists := _persisting_store(alone)) is not None:
            progress.note(f"{extra.planned[i].name}: the run alone reads a store that persists ({persists})")
        extra.run([Run(i, "alone", None, alone)], slots, 1, work, env, a, progress, clock)
    extra.walls["confirm"] = time.monotonic() - t


def _persisting_store(arm: PlannedArm) -> str | None:
    """Why a run's connector state may persist between runs (repro.plan.arms's `store`), or None: it is fresh."""
    store = arm.store
    return None if store is None or store.get("fresh") else str(store.get("why") or "not recorded")


class ScenarioRuns:
    """The scenarios a run asked for (--scenarios): each (scenario, arm) one child in a fresh engine with the
    scenario's settings, run by the scheduler like the arms, and with --trials N each (scenario, reuse arm)
    N times (the schedule control once); then the KV audit of their requests and the report's sections
    (repro.run.scenarios judges, repro.judge.trials reduces the trials)."""

    def __init__(self, opts, fixture, probes, arms, work, env, scratch, scratch_root, logs_rel) -> None:
        self.opts, self.fixture, self.probes, self.arms = opts, fixture, probes, arms
        self.work, self.env, self.scratch, self.scratch_root, self.logs_rel = work, env, scratch, scratch_root, logs_rel
        self.sections: list[dict] = []
        self.names: list[str] = []
        self.trial_errors: list[dict] = []

    def run(self, chosen, baseline: ArmResult | None, n_jobs: int, progress: Progress, clock: Clock) -> None:
        a = self.opts.args
        todo = []  # (scenario, original arm, its renamed run, trial)
        skipped: dict[str, dict[str, tuple[str, str]]] = {}  # scenario -> arm -> (mode, why)
        for sc in chosen:
            runs, skipped[sc.name] = scenarios.runs_of(sc, self.arms)
            todo += [(sc, original, run, 1) for original, run in runs]
        # trials 2..N after every first run, each a fresh engine (and store); the control runs once
        todo += [
            (sc, original, scenarios.trial_run(run, k), k)
            for sc, original, run, _ in list(todo)
            if original.spec.mode != "baseline"
            for k in range(2, a.trials + 1)
        ]
        plan = []  # (scenario, original arm, run arm, derived LMCache YAML record, trial)
        for sc, original, run, k in todo:
            run, record = scenarios.prepare(run, sc, self.work, self.scratch, self.scratch_root, a.lmcache_config)
            plan.append((sc, original, run, record, k))
        self.names = [run.name for _, _, run, _, _ in plan]
        progress.note(f"scenarios: {len(plan)} runs ({', '.join(sc.name for sc in chosen)})")

        def job_for(i: int, dependency=None) -> Job:
            sc, _, run, _, _ = plan[i]
            kv_dir = str(self.work / "kv" / run.name) if a.kv_audit else None
            return scenarios.job_for(self.opts, run, sc, self.probes, self.fixture.sha256, kv_dir)

        servers = {run.name: scenarios.mp_settings(sc) for sc, _, run, _, _ in plan}
        slots = SlotPool(arm_slots(self.opts, len(plan), n_jobs))
        outcomes = run_arms([p[2] for p in plan], job_for, slots, n_jobs, self.work, self.env, a, progress, clock,
                            servers)  # fmt: skip
        results = {
            run.name: o.result
            for (_, original, run, _, _), o in zip(plan, outcomes)
            if o is not None and o.failure is None and o.result is not None and original.spec.mode != "baseline"
        }
        raw, problem = None, None
        if a.kv_audit and results:
            if baseline is None or baseline.kv_audit is None:
                problem = "the baseline recorded no reference KV"
            else:
                progress.note("scenarios: comparing KV")
                raw, problem = kvaudit.run_compare(
                    scenarios.compare_job(baseline, results), self.work, self.env, a.python, timeout_s=a.timeout
                )
            if a.keep_kv and (self.work / "kv").exists():  # the scenario runs' tensors too (the arms' went before)
                shutil.copytree(self.work / "kv", Path(a.keep_kv), dirs_exist_ok=True)
        for sc in chosen:
            runs = [(o, run, out, rec) for (s, o, run, rec, k), out in zip(plan, outcomes) if s is sc and k == 1]
            sec = scenarios.section(sc, runs, skipped[sc.name], baseline, self.logs_rel)
            by_arm = {o_arm.name: run.name for o_arm, run, _, _ in runs}
            verdicts = {by_arm.get("baseline"): "control " + sec["control"]["status"]}
            for entry in sec["arms"]:
                name = by_arm.get(entry["arm"])
                scenarios.annotate_kv(entry, results.get(name), raw, problem, a.block_size)
                verdicts[name] = entry["verdict"]
                if a.trials > 1 and name is not None:
                    more = [(run, out, k) for (s, o_arm, run, _, k), out in zip(plan, outcomes)
                            if s is sc and k > 1 and o_arm.name == entry["arm"]]  # fmt: skip
                    verdicts |= self._trials(sc, entry, name, more, baseline, sec["control"], (results, raw, problem),
                                             clock)  # fmt: skip
            for name, verdict in verdicts.items():
                if name is not None and name in progress.arms:
                    progress.finish(name, verdict)
            self.sections.append(sec)

    def _trials(self, sc, entry: dict, name: str, more, baseline, control, audit, clock: Clock) -> dict[str, str]:
        """Trials 2..N of one (scenario, arm), each judged and audited exactly as its own run was, reduced to
        the entry's `trials` (repro.judge.trials; its verdict stays its own run's). Returns each trial's verdict."""
        results, raw, problem = audit
        shared = (clock.sharing(name) or {}).get("shared")
        runs = [trials.scenario_run_summary(entry, 1, shared)]
        verdicts = {}
        for run, outcome, k in more:
            judged = scenarios.judge_run(sc, run, outcome, baseline, control, self.logs_rel)
            scenarios.annotate_kv(judged, results.get(run.name), raw, problem, self.opts.args.block_size)
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
            for e in sec["arms"]:
                if e["error"]:
                    out.append({"arm": f"{e['arm']} (scenario {sec['name']})", "kind": e["error"]["kind"],
                                "detail": e["error"]["detail"]})  # fmt: skip
        return out + self.trial_errors


def audit_all(entries, results, baseline, work, env, a, progress) -> None:
    """The KV audit of these entries (or, with it off, the report saying so where it would speak)."""
    if not a.kv_audit:
        kvaudit.annotate(entries, results, None, None, a.block_size)
        return
    for e in entries:
        if e["name"] in results:
            progress.stage(e["name"], "comparing KV")
    names = {e["name"] for e in entries}
    audit_kv(entries, {n: r for n, r in results.items() if n in names}, baseline, work, env, a)


def _summaries(entries: list[dict], extra: Extra, clock: Clock) -> dict[int, list[tuple[str, dict]]]:
    """Per reuse arm (by index), its runs as (run name, repro.judge.trials summary): its own run first."""
    out = {}
    for i, e in enumerate(entries):
        if e["mode"] == "baseline":
            continue
        named = [(e["name"], e, 1)] + [(r.arm.name, r.entry, r.trial) for r in extra.of(i)]
        out[i] = [(n, trials.run_summary(en, k, (clock.sharing(n) or {}).get("shared"))) for n, en, k in named]
    return out


def confirmations(entries: list[dict], extra: Extra, clock: Clock, a) -> list[tuple[int, Run | None]]:
    """The arms to re-run alone: a FAIL or a CORRUPT found while sharing (--no-confirm: none)."""
    if not a.confirm:
        return []
    todo = []
    for i, named in _summaries(entries, extra, clock).items():
        found = trials.needs_confirmation([run for _, run in named])
        if found is not None:
            todo.append((i, next((r for r in extra.of(i) if r.trial == found["trial"]), None)))
    return todo


def fold_runs(entries: list[dict], extra: Extra, clock: Clock, a) -> None:
    """Each arm's entry gains its device, who shared it, its trials and its confirmation."""
    summaries = _summaries(entries, extra, clock)
    first_gpu = (visible_gpus() or ["0"])[0]  # asked once: without CUDA_VISIBLE_DEVICES it runs nvidia-smi
    for i, e in enumerate(entries):
        e["gpu"] = gpu_of(e, extra.slots[i], first_gpu)
        e["sharing"] = clock.sharing(e["name"])
        if i not in summaries:
            continue
        named = summaries[i]
        if a.trials > 1:
            e["trials"] = trials.trial_rates([run for _, run in named])
        e["confirmation"] = confirmation_of(named, extra.of(i, alone=True), clock, a)


def _no_run(status: str, why: str) -> dict:
    return {"status": status, "why": why, "run": None, "class": None, "reason": None}


def confirmation_of(named: list[tuple[str, dict]], alone: list[Run], clock: Clock, a) -> dict:
    """The report's `confirmation` of one reuse arm (repro.judge.trials classes the finding)."""
    runs = [run for _, run in named]
    found = trials.needs_confirmation(runs)
    if found is None:
        if any(trials.has_finding(r) for r in runs):
            return _no_run("not needed", "the finding came from a run that shared nothing: it needs no confirming")
        return _no_run("not needed", "no finding")
    name = next(n for n, run in named if run is found)
    label = "its run" if found["trial"] == 1 else f"trial {found['trial']}"
    why = f"{label} found it while it {who_shared(clock.sharing(name))}"
    if not a.confirm:
        return _no_run("skipped", f"--no-confirm: {why}; not re-run alone")
    if not alone:
        return _no_run("skipped", f"{why}; the run alone never ran")
    r = alone[0]
    sharing = clock.sharing(r.arm.name)
    run = trials.run_summary(r.entry, None, (sharing or {}).get("shared"))
    cls, reason = trials.classify_confirmation([x for x in runs if x.get("shared")], run)
    # Independent only when the run alone started with empty connector state: every run of an arm is made
    # fresh the same way (repro.plan.arms), so a store that persists did for the shared run too, and the run alone
    # could read what it stored.
    persists = _persisting_store(r.arm)
    if persists is not None:
        reason = f"{reason}; {STORE_PERSISTED} ({persists})"
    out = {"status": "ran", "why": why, "run": run, "class": cls, "reason": reason, "sharing": sharing}
    return out | {"independent": persists is None} | ({"store": r.arm.store} if r.arm.store is not None else {})


def gpu_of(entry: dict, slot: ArmSlot | None, first_gpu: str) -> dict | None:
    """The GPU an arm ran on: CUDA_VISIBLE_DEVICES of its slot (else the first visible) and what its
    child's torch said of it (name, compute capability); None on the CPU."""
    versions = entry.get("versions") or {}
    names, caps = versions.get("gpus") or [], versions.get("gpu_capabilities") or []
    if not names:
        return None
    visible = (slot.env if slot else {}).get("CUDA_VISIBLE_DEVICES") or first_gpu
    return {"visible": visible, "name": names[0], "compute_capability": caps[0] if caps else None}


def audit_kv(
    entries: list[dict], results: dict[str, ArmResult], baseline: ArmResult | None, work: Path, env: dict, a
) -> None:
    """Compare every audited reuse's KV with the baseline's and annotate the entries (the token
    verdicts stay as they are); --keep-kv moves the tensors there, else they go with the work dir."""
    audited = {n: r for n, r in results.items() if r.kv_audit is not None and n != getattr(baseline, "arm", None)}
    raw, problem = None, None
    t0 = time.monotonic()
    if baseline is None or baseline.kv_audit is None:
        problem = "the baseline recorded no reference KV"
    elif audited:
        raw, problem = kvaudit.run_compare(
            kvaudit.compare_job(baseline, audited), work, env, a.python, timeout_s=a.timeout
        )
    kvaudit.annotate(entries, results, raw, problem, a.block_size)
    for e in entries:
        if e.get("kv_audit") is not None:
            e["timing"]["kv_compare_s"] = round(time.monotonic() - t0, 3)
    if a.keep_kv and (work / "kv").exists():
        dest = Path(a.keep_kv)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(work / "kv", dest, dirs_exist_ok=True)
        print(f"[kvkit] KV audit tensors kept in {dest}", file=sys.stderr, flush=True)


def run_arms(
    planned: list[PlannedArm],
    job_for,
    slots: SlotPool | list[ArmSlot],
    n_jobs: int,
    work: Path,
    env: dict,
    a,
    progress: Progress,
    clock: Clock | None = None,
    server_settings: dict[str, dict] | None = None,
) -> list[ArmOutcome | None]:
    """The arms run by the scheduler (repro.run.scheduler: slots, the preflight gate, native-matched's probes,
    the stop flag), each the way this run runs one: its engine child, or, for an LMCacheMPConnector arm,
    its MP server and child. Outcomes in plan order. clock, when given, records every child's and MP
    server's window (repro.run.sharing). server_settings: an MP arm's own server settings by arm name (a
    scenario's, repro.lmcache.mp.ServerSettings fields)."""

    def run_one(arm: PlannedArm, job: Job, arm_env: dict, slot: ArmSlot) -> ArmOutcome:
        def launch(job: Job) -> ArmOutcome:
            return run_arm(
                job,
                workdir=work,
                log_path=work / f"{arm.name}.log",
                env=arm_env,
                timeout_s=a.timeout,
                python=a.python,
                module=a.engine_module,
                disk=DiskLimits.from_gb(a.max_child_disk_gb),
            )

        start = clock.now() if clock else 0.0
        if job.arm.connector is not None and job.arm.connector.name == lmcache_mp.CONNECTOR:
            own = (server_settings or {}).get(arm.name) or {}
            outcome = _run_with_mp_server(job, arm_env, work, a, progress, launch, clock, slot, own)
        else:
            outcome = launch(job)
        if clock:
            clock.record(f"arm {arm.name}", ARM, arm.name, slot, start)
        return outcome

    return scheduler.run_arms(planned, job_for, slots, n_jobs, work, env, run_one, progress)


def _run_with_mp_server(
    job: Job,
    env: dict,
    work: Path,
    a,
    progress: Progress,
    launch,
    clock: Clock | None = None,
    slot=None,
    settings_over: dict | None = None,
) -> ArmOutcome:
    """An LMCacheMPConnector arm: the kit starts LMCache's MP server (repro.lmcache.mp) for this arm
    alone, points the connector at it, runs the arm, and stops the server whatever happens. A server
    that does not start, or dies while the arm runs, is the arm's named failure: a result made
    against a dead server is no evidence (the connector silently recomputes then)."""
    name = job.arm.name
    server_log = lmcache_mp.server_log_path(work, name)
    outcome = None
    start = clock.now() if clock else 0.0
    try:
        progress.stage(name, "starting the LMCache MP server")
        own = {"module": a.lmcache_server_module} if a.lmcache_server_module else {}
        settings = lmcache_mp.ServerSettings(**own, **(settings_over or {}))
        with lmcache_mp.mp_server(a.python, server_log, env, settings=settings) as server:
            conn = job.arm.connector
            extra = {**conn.extra_config, **server.extra_config()}
            job = replace(job, arm=replace(job.arm, connector=replace(conn, extra_config=extra)))
            outcome = launch(job)
            server.check()
    except lmcache_mp.ServerError as exc:
        if outcome is None:  # never ran: the arm's log is the server's, or the kit's word when there is none
            log = server_log if server_log.exists() else _never_ran_log(work, name, exc)
            return ArmOutcome(name, None, exc.failure(), log, exc.log_tail, 0.0, server_copy_path=exc.copy_path)
        return replace(outcome, result=None, failure=exc.failure(), server_copy_path=exc.copy_path)
    finally:
        if clock:
            clock.record(f"LMCache MP server of {name}", SERVER, name, slot, start)
    return replace(outcome, server_copy_path=server.copy_path)


def _never_ran_log(work: Path, name: str, exc: lmcache_mp.ServerError) -> Path:
    """The arm's log when neither it nor its MP server wrote one (the server could not be started): one
    line of the kit's saying why, so that the report never cites a log that is not there."""
    path = work / f"{name}.log"
    atomic.write_bytes_atomic(path, f"kvkit: {name} never ran: {exc.kind}: {exc.detail}\n".encode())
    return path


@contextlib.contextmanager
def publish_logs(work: Path, dest: Path, names: list[str]):
    """Swap in the new arm logs for the block that writes the report: only a run that completed replaces
    the previous report's logs, and a block that fails (a report that cannot be written: a full disk, an
    interrupt) puts the previous ones back, so that the previous report keeps its own logs. Renames only,
    which a full disk allows."""
    staged = work / "logs"
    staged.mkdir()
    for n in names:
        src = work / f"{n}.log"
        if src.exists():
            os.replace(src, staged / f"{n}.log")
    old = dest.with_name(dest.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    had = dest.exists()
    if had:
        os.replace(dest, old)
    try:
        os.replace(staged, dest)
        yield
    except BaseException:
        if dest.exists():
            os.replace(dest, staged)  # the new logs go back into the work directory, and with it
        if had:
            os.replace(old, dest)
        raise
    shutil.rmtree(old, ignore_errors=True)


def assemble(
    opts: Options,
    fixture: Fixture,
    entries: list[dict],
    argv: list[str],
    env: dict,
    started: str,
    wall_s: float,
    n_jobs: int = 1,
) -> dict:
    a = opts.args
    prov = collect_provenance(
        argv=argv,
        env=env,
        started=started,
        fixture_path=a.fixture,
        fixture_sha256=fixture.sha256,
        model=a.model,
        lmcache_config=a.lmcache_config,
    )
    prov["ended_utc"] = utc_now()
    prov["pythonhashseed"] = HASHSEED
    base = next((e for e in entries if e["mode"] == "baseline"), None)
    if base and base.get("versions"):
        prov["engine_versions"] = base["versions"]
    errors = [{"arm": e["name"], **{k: e["error"][k] for k in ("kind", "detail")}} for e in entries if e["error"]]
    warnings = [{"arm": e["name"], "message": m, "count": c} for e in entries for m, c in e["warnings"].items()]
    starts = [e["timing"].get("engine_start_s") for e in entries if e["timing"].get("engine_start_s") is not None]
    return {
        "kind": REPORT_KIND,
        "schema_version": REPORT_SCHEMA_VERSION,
        "tool_version": __version__,
        "claim_eligible": False,
        "complete": True,
        "fixture": {"name": fixture.name, "tokenizer": fixture.tokenizer, "sha256": fixture.sha256},
        "config": {
            "model": a.model,
            "model_revision": a.model_revision,
            "dtype": a.dtype,
            "block_size": a.block_size,
            "max_tokens": a.max_tokens,
            "max_model_len": a.max_model_len,
            "seed": a.seed,
            "gpu_memory_utilization": a.gpu_memory_utilization,
            "device": a.device,
            "suite": a.suite,
            "compare_native": a.compare_native,
            "reuses": a.reuses,
            "logprobs": a.logprobs,
            "kv_connector": a.kv_connector,
            "kv_connector_module_path": a.kv_connector_module_path,
            "lmcache_config": a.lmcache_config,
            "kv_audit": a.kv_audit,
            "keep_kv": a.keep_kv,
            "batch_invariant": a.batch_invariant,
            "frontend": a.frontend,
            "jobs": n_jobs,
            "decoding": "greedy, ignore_eos, enforce_eager",
        },
        "arms": entries,
        "generations": generations(entries),
        "acceptance": check_acceptance(entries, fixture.expected, a.suite, fixture.expected_kv if a.kv_audit else None),
        "warnings": warnings,
        "errors": errors,
        "hardware_label": hardware_label(prov["hardware"]),
        "provenance": prov,
        # Diagnostics only, for `make bench`: never a performance claim (claim_eligible is false).
        "diagnostics": {"wall_s": round(wall_s, 3), "engine_start_s_sum": round(sum(starts), 3)},
    }


def _interrupted(state: RunState, why: str) -> int:
    if state.published is not None:  # the signal arrived after the report and its logs were swapped in
        say_error(
            f"{INTERRUPTED} ({why}) after the run completed: {state.report_path} and its logs are the new, "
            "complete report"
        )
        return exit_code(state.published)
    say_error(f"{INTERRUPTED} ({why}): children killed; no report written, the previous one is untouched")
    return EXIT_INTERRUPTED


def _verify(argv: list[str]) -> int:
    state = RunState()
    try:
        return run(parse_args(argv), argv, state)
    except (KeyboardInterrupt, Interrupted) as exc:
        return _interrupted(state, str(exc) or "SIGINT")
    except UsageError:
        raise  # repro.commands.run_command: one line, exit 2
    except LoadError as exc:  # the neighbour did not start: no arm result is worth a report
        with contextlib.suppress(OSError, ValueError):
            print(exc.log_tail, file=sys.stderr)
        say_error(f"{exc.flag}: {exc}; no report written")
        return EXIT_RUNTIME
    except PermissionError as exc:  # a path the user gave that cannot be written: bad input, not a crash
        raise UsageError(f"{exc.strerror or exc}: {exc.filename or ''}".rstrip(": ")) from None
    except OSError as exc:  # the machine's, not the kit's: a full disk, an I/O error; one line, exit 3
        where = f": {exc.filename}" if exc.filename else ""
        say_error(f"{exc.strerror or exc}{where}; {_written(state)}")
        return EXIT_RUNTIME
    except Exception:  # noqa: BLE001 - a kit bug: say so, keep the traceback, and never exit 0 or 1
        with contextlib.suppress(OSError, ValueError):
            traceback.print_exc()
        say_error(f"internal error in the kit (traceback above); {_written(state)}")
        return EXIT_RUNTIME


def _written(state: RunState) -> str:
    """What an error after the start left on disk, for its one line."""
    return f"{state.report_path} was written before the error" if state.published else "no report written"


def main(argv: list[str] | None = None) -> int:
    """`python -m repro.verify_kv_reuse ARGS`: bad usage 2, OSError 3, interrupt 130 (repro.commands)."""

    def _on_term(signum, frame):
        raise Interrupted(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, _on_term)
    return run_command(_verify, list(sys.argv[1:] if argv is None else argv))
