"""The arms' runs: each arm's own (native-matched fed what its connector arm reused), then trials 2..N of every
reuse arm, all beside the load neighbour when one is asked for; later, each finding made while sharing re-run
alone (repro.run.confirm decides which). Each run beyond an arm's own is a Run: the arm renamed, with
connector state of its own (repro.plan.arms.materialize), judged like its arm (repro.run.entries)."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, replace
from pathlib import Path

from repro.contract.job import Job
from repro.errors import UsageError
from repro.plan.arms import ArmSlot, PlannedArm, arm_job, arm_slots, matched_probes, materialize, persisting_store
from repro.plan.devices import visible_gpus
from repro.plan.run_plan import RunPlan
from repro.plan.settings import ChildSettings, EngineSettings, Loads
from repro.run import cpu_load, gpu_load
from repro.run.clock import Clock
from repro.run.launch import run_arms
from repro.run.progress import Progress
from repro.run.runner import ArmOutcome
from repro.run.scheduler import SlotPool
from repro.run.sharing import CPU_CORES, CPU_LOAD, GPU_LOAD, gpu_resource
from repro.run.workspace import Workspace


@dataclass
class Run:
    """One more run of a reuse arm: a trial (2..N) or the confirmation alone."""

    primary: int  # index of the arm it repeats
    label: str  # "trial 3", "alone"
    trial: int | None
    arm: PlannedArm  # renamed: <arm>~trial3, <arm>~alone
    slot: ArmSlot | None = None  # the slot it took when it launched, once it ran
    entry: dict | None = None  # judged like an arm (repro.run.entries), once it ran
    outcome: ArmOutcome | None = None  # how it went, once it ran


class ArmJobs:
    """Each arm's job as the scheduler asks for it, job_for(i, dependency) (the engine settings of the slot it
    takes come with the slot); native-matched's probes from what its connector arm reused (`matched`: per
    such arm, the probes it skipped and what it matched). A trial or a confirmation passes its own renamed,
    freshly materialized arm, and never makes the preflight."""

    def __init__(self, plan: RunPlan, work: Path, planned: list[PlannedArm]) -> None:
        self.engine, self.inputs, self.preflight = plan.engine, plan.inputs, plan.preflight
        self.kv_root = work / "kv" if plan.kv_audit.enabled else None
        self.planned = planned  # updated in place once the arms ran (native-matched's skipped probes)
        self.probes = list(plan.inputs.probes)
        self.matched: dict[str, tuple[dict, dict]] = {}

    def __call__(self, i: int, dependency: ArmOutcome | None = None, arm: PlannedArm | None = None) -> Job:
        own = arm is None
        arm = arm or self.planned[i]
        kv_dir = str(self.kv_root / arm.name) if self.kv_root is not None else None
        preflight = self.preflight if i == 0 and own else None
        job = arm_job(self.engine, self.inputs.reuses, arm, self.probes, self.inputs.fixture.sha256, preflight, kv_dir)
        if self.planned[i].match_arm is not None:
            conn = dependency.result if dependency is not None and dependency.failure is None else None
            probe_jobs, skipped, info = matched_probes(self.planned[i], self.probes, conn, self.engine.block_size)
            if own:
                self.matched[arm.name] = (skipped, info)
            job = replace(job, probes=tuple(probe_jobs))
        return job


class ArmRuns:
    """What the arms' runs left: each arm as it ran (`planned`), its outcome and slot, and the runs beyond
    (`runs`: trials, confirmations alone), with the walls of each stage and the load neighbour's record."""

    def __init__(self, ws: Workspace, children: ChildSettings, planned, outcomes, slots, jobs: ArmJobs) -> None:
        self.ws, self.children = ws, children
        self.planned, self.outcomes, self.slots, self.jobs = planned, outcomes, slots, jobs
        self.runs: list[Run] = []
        self.walls: dict[str, float] = {}
        self.load_record: dict | None = None  # the neighbour's, once stopped: its end, how it ended, its counters
        self.load_name: str | None = None

    def fresh(self, i: int, suffix: str) -> PlannedArm:
        """Arm i again, named <arm>~<suffix>, with connector state of its own (repro.plan.arms.materialize: fresh
        @tmpdir directories, a fresh subfolder of a store directory the user named, LMCache's likewise), so its
        cold request is cold again; its `store` says so, or why its state may persist (a remote server)."""
        arm = self.ws.arms[i]
        arm = replace(arm, spec=replace(arm.spec, name=f"{arm.name}~{suffix}"), match_arm=None)
        return materialize(arm, self.ws.scratch, self.ws.scratch_root)

    def run(self, runs: list[Run], slots: list[ArmSlot], n_jobs: int, progress: Progress) -> None:
        """These runs, up to n_jobs at a time, each in a free one of these slots when it launches."""
        index = {arm.name: i for i, arm in enumerate(self.planned)}

        def job_for(j: int, dependency=None) -> Job:
            r = runs[j]
            match = self.planned[r.primary].match_arm
            dep = self.outcomes[index[match]] if match is not None else None
            return self.jobs(r.primary, dep, r.arm)

        pool = SlotPool(slots)
        ws = self.ws
        outcomes = run_arms([r.arm for r in runs], job_for, pool, n_jobs, ws.work, ws.env, self.children, progress,
                            ws.clock)  # fmt: skip
        for r, outcome in zip(runs, outcomes):
            if outcome is None:
                continue
            r.slot, r.outcome = pool.taken[r.arm.name], outcome
            self.runs.append(r)

    def of(self, i: int, alone: bool = False) -> list[Run]:
        """Arm i's trials (or its run alone) that ran and were judged."""
        return [r for r in self.runs if r.primary == i and (r.trial is None) == alone and r.entry is not None]

    def names(self) -> list[str]:
        return [r.arm.name for r in self.runs]


def run_arms_and_trials(plan: RunPlan, ws: Workspace, progress: Progress) -> ArmRuns:
    """Every arm's own run, then (--trials N) trials 2..N of every reuse arm, beside the load neighbour
    (stopped before any confirmation alone). The first child's preflight problems stop the run (exit 2)."""
    n_jobs = plan.jobs
    pool = SlotPool(arm_slots(plan.engine, len(ws.arms), n_jobs))
    planned = [materialize(p, ws.scratch, ws.scratch_root) for p in ws.arms]
    jobs = ArmJobs(plan, ws.work, planned)
    progress.note(f"{len(planned)} arms, {min(n_jobs, len(planned))} at a time")
    with load_neighbour(plan.loads, plan.children.python, ws.env, ws.work, ws.clock) as load:
        outcomes = run_arms(planned, jobs, pool, n_jobs, ws.work, ws.env, plan.children, progress, ws.clock)
        arms_wall = ws.clock.now()
        for i, arm in enumerate(planned):
            if arm.name in jobs.matched:
                planned[i] = replace(arm, skip_probes={**arm.skip_probes, **jobs.matched[arm.name][0]})
        first = outcomes[0]
        if first is not None and first.result is not None and first.result.preflight_problems:
            raise UsageError("; ".join(first.result.preflight_problems))
        slots = [pool.taken.get(arm.name) for arm in planned]  # where each ran
        ran = ArmRuns(ws, plan.children, planned, outcomes, slots, jobs)
        ran.walls["arms"] = arms_wall
        if plan.repeats.trials > 1:
            progress.note(f"trials 2 to {plan.repeats.trials} of every reuse arm")
            run_trials(ran, plan.repeats.trials, n_jobs, plan.engine, progress)
    ran.load_record = load.record() if load is not None else None
    ran.load_name = load.kind.name if load is not None else None
    return ran


def run_trials(ran: ArmRuns, n: int, n_jobs: int, engine: EngineSettings, progress: Progress) -> None:
    """Trials 2..n of every reuse arm, each a fresh engine (and MP server) with connector state of its own
    (ArmRuns.fresh), as many at once as the arms themselves ran, each in a free slot when it launches."""
    todo = [(i, k) for i, arm in enumerate(ran.planned) if arm.spec.mode != "baseline" for k in range(2, n + 1)]
    if not todo:
        return
    slots = arm_slots(engine, len(todo), n_jobs)  # shares for as many at once as --jobs allows
    runs = [Run(i, f"trial {k}", k, ran.fresh(i, f"trial{k}")) for i, k in todo]
    for i in dict.fromkeys(i for i, _ in todo):
        if (persists := persisting_store(ran.planned[i])) is not None:
            progress.note(f"{ran.planned[i].name}: its trials share a store that persists ({persists})")
    t = time.monotonic()
    ran.run(runs, slots, n_jobs, progress)
    ran.walls["trials"] = time.monotonic() - t


def run_confirmations(ran: ArmRuns, todo: list[tuple[int, Run | None]], engine: EngineSettings, progress) -> None:
    """Each shared finding's job again, alone: one at a time, nothing else on the device (no other
    arm, no load neighbour), the same engine settings and device as the run it confirms (todo: the arm's
    index and its run that found it, None for the arm's own; repro.run.confirm.to_confirm)."""
    t = time.monotonic()
    for i, shared_run in todo:
        slot = shared_run.slot if shared_run is not None else ran.slots[i]  # the one the finding's run took
        progress.note(f"re-running {ran.planned[i].name} alone to confirm its finding")
        slots = [slot] if slot is not None else arm_slots(engine, 1, 1)
        alone = ran.fresh(i, "alone")  # connector state of its own: what the shared run stored is not read
        if (persists := persisting_store(alone)) is not None:
            progress.note(f"{ran.planned[i].name}: the run alone reads a store that persists ({persists})")
        ran.run([Run(i, "alone", None, alone)], slots, 1, progress)
    ran.walls["confirm"] = time.monotonic() - t


@contextlib.contextmanager
def load_neighbour(loads: Loads, python: str, env: dict, work: Path, clock: Clock):
    """--gpu-load: the neighbour keeps every visible GPU busy; --cpu-load: every CPU core the kit may use.
    Either runs while the arms and their trials run and is stopped and reaped on leaving, before any
    confirmation alone; its window is recorded like an arm's, ending at its stop."""
    if loads.gpu:
        targets = visible_gpus() or ["0"]
        module, kind, resources = gpu_load, GPU_LOAD, [gpu_resource(g) for g in targets]
    elif loads.cpu:
        targets, module, kind, resources = cpu_load.cores(), cpu_load, CPU_LOAD, [CPU_CORES]
    else:
        yield None
        return
    start = clock.now()
    try:
        with module.neighbour(python, targets, env, module.load_log_path(work), t0=clock.t0) as load:
            yield load
    finally:
        clock.record(kind, kind, None, None, start, resources=resources)
