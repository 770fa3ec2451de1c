"""How the verifier runs its arms: the scheduler (repro.run.scheduler) decides when and where, this module how
one arm runs there: its engine child (repro.run.runner.run_arm), or for an LMCacheMPConnector arm the MP
server the kit starts for it alone (repro.lmcache.mp) and then its child. Every child's and server's window
goes on the run's clock (repro.run.clock)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from repro.contract.job import Job
from repro.lmcache import mp as lmcache_mp
from repro.plan.arms import ArmSlot, PlannedArm
from repro.plan.settings import ChildSettings
from repro.record import atomic
from repro.run import scheduler
from repro.run.clock import Clock
from repro.run.diskwatch import DiskLimits
from repro.run.progress import Progress
from repro.run.runner import ArmOutcome, run_arm
from repro.run.sharing import ARM, SERVER


def run_arms(
    planned: list[PlannedArm],
    job_for,
    slots: scheduler.SlotPool | list[ArmSlot],
    n_jobs: int,
    work: Path,
    env: dict,
    children: ChildSettings,
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
                timeout_s=children.timeout_s,
                python=children.python,
                module=children.engine_module,
                disk=DiskLimits.from_gb(children.max_disk_gb),
            )

        start = clock.now() if clock else 0.0
        if job.arm.connector is not None and job.arm.connector.name == lmcache_mp.CONNECTOR:
            own = (server_settings or {}).get(arm.name) or {}
            outcome = run_with_mp_server(job, arm_env, work, children, progress, launch, clock, slot, own)
        else:
            outcome = launch(job)
        if clock:
            clock.record(f"arm {arm.name}", ARM, arm.name, slot, start)
        return outcome

    return scheduler.run_arms(planned, job_for, slots, n_jobs, work, env, run_one, progress)


def run_with_mp_server(
    job: Job,
    env: dict,
    work: Path,
    children: ChildSettings,
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
        own = {"module": children.lmcache_server_module} if children.lmcache_server_module else {}
        settings = lmcache_mp.ServerSettings(**own, **(settings_over or {}))
        with lmcache_mp.mp_server(children.python, server_log, env, settings=settings) as server:
            conn = job.arm.connector
            extra = {**conn.extra_config, **server.extra_config()}
            job = replace(job, arm=replace(job.arm, connector=replace(conn, extra_config=extra)))
            outcome = launch(job)
            server.check()
    except lmcache_mp.ServerError as exc:
        if outcome is None:  # never ran: the arm's log is the server's, or the kit's word when there is none
            log = server_log if server_log.exists() else never_ran_log(work, name, exc)
            return ArmOutcome(name, None, exc.failure(), log, exc.log_tail, 0.0, server_copy_path=exc.copy_path)
        return replace(outcome, result=None, failure=exc.failure(), server_copy_path=exc.copy_path)
    finally:
        if clock:
            clock.record(f"LMCache MP server of {name}", SERVER, name, slot, start)
    return replace(outcome, server_copy_path=server.copy_path)


def never_ran_log(work: Path, name: str, exc: lmcache_mp.ServerError) -> Path:
    """The arm's log when neither it nor its MP server wrote one (the server could not be started): one
    line of the kit's saying why, so that the report never cites a log that is not there."""
    path = work / f"{name}.log"
    atomic.write_bytes_atomic(path, f"kvkit: {name} never ran: {exc.kind}: {exc.detail}\n".encode())
    return path
