"""Where one run's children run, and what they inherit: the work directory beside the report (its owner
recorded for the next run's sweep, repro.run.workdir), the scratch directories its connector stores take,
the children's environment with LMCache's copy path in it (repro.lmcache.ops), each fixture arm's own copy
path, and the run's clock. Whatever happens, the work directory and the scratch go at the end, whole."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

from repro.lmcache import mp as lmcache_mp
from repro.lmcache import ops as lmcache_ops
from repro.plan.arms import LMCACHE_CONFIG_ENV, PlannedArm, is_lmcache_connector
from repro.plan.options import FRONTEND_ENV, STREAM_ENV
from repro.plan.settings import HASHSEED, EngineSettings, LMCacheSettings, engine_layout_env
from repro.record.provenance import utc_now
from repro.run import workdir
from repro.run.clock import Clock, resource_for
from repro.run.runner import child_env, deferred_signals


@dataclass
class Workspace:
    """One run's place and environment (module docstring)."""

    report: Path
    logs_rel: str  # the report's logs folder as the report names it
    work: Path
    scratch_root: str
    env: dict  # every child's (an LMCache arm's own copy path goes in its PlannedArm's env)
    arms: list[PlannedArm]  # the plan's, a fixture arm's own copy path applied
    ops: lmcache_ops.OpsPlan | None  # the run's LMCache copy path, when an arm uses LMCache
    arms_ops: dict[str, dict]  # per fixture arm with a copy path of its own: what it resolved to
    started: str  # UTC, for the report's provenance
    t0: float
    clock: Clock
    scratch: list[str] = field(default_factory=list)  # under scratch_root: gone with it

    def wall_s(self) -> float:
        return time.monotonic() - self.t0

    def log_names(self, names: list[str]) -> list[str]:
        """These runs' logs and, after them, each one's LMCache MP server's where it wrote one."""
        return names + [server.stem for n in names if (server := lmcache_mp.server_log_path(self.work, n)).exists()]


@contextlib.contextmanager
def workspace(
    report: Path,
    logs_rel: str,
    arms: list[PlannedArm],
    engine: EngineSettings,
    lmcache: LMCacheSettings,
    python: str,
) -> Iterator[Workspace]:
    """The run's workspace beside the report (module docstring); resolving a copy path that cannot be had
    (--lmcache-ops compiled without the ops) stops the run here, exit 2, before any work directory."""
    report.parent.mkdir(parents=True, exist_ok=True)
    started = utc_now()
    extra_env = {
        "LMCACHE_LOG_LEVEL": os.environ.get("LMCACHE_LOG_LEVEL", "INFO"),  # its hit lines are INFO
        # the flag decides, not whatever the caller's environment holds; every worker reports what it ran
        "VLLM_BATCH_INVARIANT": "1" if engine.batch_invariant else "0",
        FRONTEND_ENV: engine.frontend,  # the engine child's front end (repro.engine.frontend); the flag decides
        STREAM_ENV: "1" if engine.stream else "0",  # a served arm's requests streamed (--stream)
        **engine_layout_env(engine.engine_layout),  # the engine's processes (--engine-layout)
    }
    if lmcache.config:
        extra_env[LMCACHE_CONFIG_ENV] = str(Path(lmcache.config).resolve())
    env = child_env(dict(os.environ), hashseed=HASHSEED, extra=extra_env)
    arms, arms_ops = own_copy_paths(list(arms), python, env)
    ops = None
    if any(is_lmcache_connector(arm.spec.connector) for arm in arms):
        ops = lmcache_ops.resolve(lmcache.ops, python, env)  # compiled ops or the fallback, for every process
        env = lmcache_ops.apply(ops, env)
    said = workdir.sweep_line(workdir.sweep_stale(report.parent))  # what kill -9 left of earlier runs
    if said:
        print(said, file=sys.stderr, flush=True)
    work, scratch_root = workdir.make_work_dir(report)  # its owner recorded, for the next run's sweep
    t0 = time.monotonic()
    ws = Workspace(report, logs_rel, work, scratch_root, env, arms, ops, arms_ops, started, t0,
                   Clock(t0, resource_for(engine.device)))  # fmt: skip
    try:
        yield ws
    finally:
        # whole or not at all: a signal (a verifier in a matrix cell gets SIGTERM more than once) that cut
        # it short left a work folder without its owner record, which no later run sweeps
        with deferred_signals():
            workdir.remove_work_dir(work, scratch_root)
            for d in ws.scratch:  # under scratch_root: gone with it
                shutil.rmtree(d, ignore_errors=True)


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
